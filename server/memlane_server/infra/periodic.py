"""``Periodic``: a coroutine run every few seconds on the event loop, until stopped.

The one shape of the sidecar's background loops (LTM upkeep, access-policy reload, metric sampling):
started once, stopped by cancellation at shutdown, and kept alive through a failing round (logged;
the next round retries), so an upkeep error never takes the server down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("memlane")


class Periodic:
    def __init__(
        self, name: str, tick: Callable[[], Awaitable[object]], interval_s: float, *, at_once: bool = False
    ) -> None:
        """``tick`` runs every ``interval_s`` seconds; with ``at_once`` the first time right at start."""
        self.name = name
        self.interval_s = interval_s
        self._tick = tick
        self._at_once = at_once
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"memlane-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        if not self._at_once:
            await asyncio.sleep(self.interval_s)
        while True:
            try:
                await self._tick()
            except Exception:  # a failing round must not end the loop; the next one retries
                log.exception("%s failed", self.name)
            await asyncio.sleep(self.interval_s)
