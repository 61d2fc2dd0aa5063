"""Batched usage bumps: assembly reports which items it injected, the table is written once a second.

Recording is a dict update on the event loop (no I/O on the hot path). The flusher groups ids by
their increment so a burst of bumps costs a handful of table versions, not one per item.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, defaultdict

from . import filters
from .store import LanceMemoryStore

log = logging.getLogger(__name__)


class UsageRecorder:
    def __init__(
        self, store: LanceMemoryStore, *, flush_interval_s: float = 1.0, max_pending: int = 512
    ) -> None:
        self._store = store
        self._interval = flush_interval_s
        self._max_pending = max_pending
        self._pending: Counter[str] = Counter()
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self._lock = asyncio.Lock()

    def record(self, ids: list[str]) -> None:
        """Count one use of each id; never blocks, never raises for unknown ids."""
        for memory_id in ids:
            if memory_id:
                self._pending[memory_id] += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="memlane-usage-flush")
        if len(self._pending) >= self._max_pending:
            self._kick.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow stop()'s cancel
                async with asyncio.timeout(self._interval):
                    await self._kick.wait()
            self._kick.clear()
            try:
                await self.flush()
            except Exception:  # a failed flush must not kill the recorder; the counts are retried
                log.exception("usage flush failed")

    async def flush(self) -> None:
        """Write pending bumps now (also called at shutdown and by tests that need read-your-writes)."""
        async with self._lock:
            if not self._pending:
                return
            batch, self._pending = self._pending, Counter()
            now_ms = int(time.time() * 1000)
            by_increment: defaultdict[int, list[str]] = defaultdict(list)
            for memory_id, count in batch.items():
                by_increment[count].append(memory_id)
            groups = list(by_increment.items())
            for n, (increment, ids) in enumerate(groups):
                try:
                    # Both values are ints produced here, never caller text.
                    await self._store.update(
                        filters.with_ids(ids),
                        {"usage_count": f"usage_count + {int(increment)}", "last_used_at_ms": str(now_ms)},
                    )
                except Exception:
                    # Requeue only what was not written, so a retry does not count twice.
                    for inc, rest in groups[n:]:
                        for memory_id in rest:
                            self._pending[memory_id] += inc
                    raise

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()
