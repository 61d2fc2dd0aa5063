"""Background upkeep of the memory table: optimize (compaction, index refresh, version cleanup),
the vector index once the table is large, and the scheduled pruning job.

Every ``add``/``update`` makes a table version and leaves new rows outside the indexes until the next
optimize; doing that on a timer keeps writes cheap and searches fast.
"""

from __future__ import annotations

import logging
import time

from ..infra.periodic import Periodic
from .service import MemoryService

log = logging.getLogger(__name__)


class MemoryMaintenance:
    def __init__(
        self,
        service: MemoryService,
        *,
        optimize_interval_s: float,  # these four from the settings (wiring/), which hold the defaults
        prune_interval_s: float,
        vector_index_min_rows: int,
        optimize_after_writes: int,
        check_interval_s: float = 5.0,
    ) -> None:
        self._service = service
        self._optimize_interval = optimize_interval_s
        self._optimize_after_writes = optimize_after_writes
        self._check_interval = min(check_interval_s, optimize_interval_s)
        self._prune_interval = prune_interval_s
        self._vector_index_min_rows = vector_index_min_rows
        self._last_prune = self._last_optimize = time.monotonic()
        self._loop = Periodic("ltm-maintenance", self._tick, self._check_interval)

    def start(self) -> None:
        self._loop.start()

    async def run_once(self, *, prune: bool = True) -> None:
        store = self._service.store
        await self._service.flush_usage()
        if prune:
            report = await self._service.prune()
            if report.total:
                log.info("pruned %d memories (%s)", report.total, report)
        await store.ensure_vector_index(self._vector_index_min_rows)
        if store.writes_since_optimize:
            await store.optimize()

    async def _tick(self) -> None:
        # A burst of writes (promotions) leaves many small fragments outside the full-text index, and
        # every search pays for scanning them: optimize early once enough writes piled up, not only
        # on the timer.
        now = time.monotonic()
        after = self._optimize_after_writes
        piled = after > 0 and self._service.store.writes_since_optimize >= after
        if not piled and now - self._last_optimize < self._optimize_interval:
            return
        due = now - self._last_prune >= self._prune_interval
        try:
            await self.run_once(prune=due)
        finally:  # a failed round (logged by Periodic) waits for the next interval like a good one
            self._last_optimize = time.monotonic()
            if due:
                self._last_prune = self._last_optimize

    async def close(self) -> None:
        await self._loop.stop()
