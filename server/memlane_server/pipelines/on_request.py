"""PromoteSession: a session end on request, run where background work runs (a worker process), with the
caller waiting for it.

The serving process never runs the pipeline itself: it queues a forced job on the background job stream
and watches the session until it is archived. The job is the same one an expiry or a close queues, so a
worker's lease, keep-alive, hand-back at shutdown and take-over after a crash all apply, and a call that
gives up (its deadline) leaves the job to finish anyway.
"""

from __future__ import annotations

import asyncio
import time

from ..errors import FailedPrecondition, Unavailable
from ..sessions.ending import REASON_FORCED, EndState, SessionEndQueue
from ..sessions.lifecycle import Lifecycle
from ..sessions.model import PromotionState, SessionStatus
from ..sessions.store import SessionStore, now_ms
from .session_end import EndReport, SessionEndPipeline

_ENDED = (SessionStatus.CLOSED, SessionStatus.EXPIRED)
# Polling the session while the worker runs: short at first (a small session ends in milliseconds),
# then at most this often (a long one costs one read per interval).
_FIRST_POLL_S = 0.005
_MAX_POLL_S = 0.1


class EndOnRequest:
    def __init__(
        self,
        store: SessionStore,
        lifecycle: Lifecycle,
        queue: SessionEndQueue,
        state: EndState,
        pipeline: SessionEndPipeline,
    ) -> None:
        self._store = store
        self._lifecycle = lifecycle
        self._queue = queue
        self._state = state
        self._pipeline = pipeline

    async def run(self, session_id: str, *, close: bool, wait_s: float) -> EndReport:
        """Ends the session (closing it first when ``close``) and returns once it is archived; a
        ``TimeoutError`` after ``wait_s`` (the job goes on), ``Unavailable`` when a run failed (it is
        retried in the background, and parked after repeated failures)."""
        s = await self._store.get(session_id)
        if s.status not in _ENDED:
            if not close:
                raise FailedPrecondition(
                    f"session {session_id!r} is {s.status.name.lower()}; close it first or set close"
                )
            await self._lifecycle.close(session_id)
        if await self._archived(session_id):
            return await self._pipeline.report(session_id, ran=False)
        job_id = await self._queue.enqueue(session_id, REASON_FORCED, now_ms())
        deadline = time.monotonic() + wait_s
        delay = _FIRST_POLL_S
        while True:
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            queued, failures = await self._queue.job_state(job_id)
            if not queued and await self._archived(session_id):
                return await self._pipeline.report(session_id, ran=True)
            if failures:
                raise Unavailable(
                    f"the session end of {session_id!r} failed; it is retried in the background "
                    "(see the server log, and `memlane jobs` if it is parked)"
                )
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the session end of {session_id!r} is still running")
            delay = min(delay * 2, _MAX_POLL_S)

    async def _archived(self, session_id: str) -> bool:
        """Archived through its last message: what a finished session end leaves."""
        s = await self._store.get(session_id)
        if s.promotion_state is not PromotionState.ARCHIVED:
            return False
        if s.retirement is not None:  # retired after its archive: the stub keeps no progress to compare
            return True
        return (await self._state.progress(session_id)).archived_through >= s.last_seq
