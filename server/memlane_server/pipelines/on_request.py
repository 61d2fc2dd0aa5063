"""Session-end work a request asks for. PromoteSession: a session end on request, run where background
work runs (a worker process), with the caller waiting for it. Resumption: a session that ended (retired
to the archive, or expired) taken up again when someone uses it.

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
from ..sessions.events import EventType, pending
from ..sessions.lifecycle import Lifecycle
from ..sessions.model import Message, PromotionState, Session, SessionStatus
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


# --- Resumption ------------------------------------------------------------------------------------------
# Resumption: a retired session comes back from the archive when someone uses it again, and an expired
# one is taken up again when someone appends to it (``revive``: ACTIVE, with a RESUMED event; AppendMessages
# calls it when the store's append met the session expired, then appends again).
#
# ``ensure_hot(session_id)`` is what GetSession, ListMessages and AssembleContext call first. For a session
# that is not retired it costs one HGET. For a retired stub it reloads the channel's ``resume_turns`` most
# recent turns and the framework's checkpoints from the archive (the summary never left the stub), makes
# the session active again and clears the retired mark last, so a resumption that dies half-way is simply
# redone by the next call.


class Resumer:
    def __init__(
        self,
        store: SessionStore,
        lifecycle: Lifecycle,
        pipeline: SessionEndPipeline,
        *,
        wait_s: float = 10.0,
    ) -> None:
        self._store = store
        self._lifecycle = lifecycle
        self._pipeline = pipeline
        self._wait_s = wait_s

    async def resume_if_retired(self, session: Session) -> bool:
        """``ensure_hot`` for a caller that already holds the document: no I/O unless it is retired."""
        if session.retirement is None:
            return False
        return await self.ensure_hot(session.session_id)

    async def ensure_hot(self, session_id: str) -> bool:
        """Reloads a retired session; True if it did. Unknown ids are left for the caller to report."""
        if await self._store.retirement(session_id) is None:
            return False
        out = await self._pipeline.locked(
            session_id, lambda: self._resume(session_id), None, wait_s=self._wait_s
        )
        if out is None:
            raise Unavailable(f"session {session_id!r} is being resumed or retired elsewhere; retry")
        return out

    async def revive(self, session_id: str) -> None:
        """Takes an expired session up again (ACTIVE, with its RESUMED event; a retired one comes back
        from the archive first), so new messages may be appended to it."""
        if await self.ensure_hot(session_id):  # retired too: reloaded from the archive, with RESUMED
            return
        done = await self._pipeline.locked(
            session_id, lambda: self._lifecycle.revive(session_id), None, wait_s=self._wait_s
        )
        if done is None:
            raise Unavailable(f"session {session_id!r} is still being ended elsewhere; retry")

    async def _resume(self, session_id: str) -> bool:
        s = await self._store.get(session_id)
        retired = s.retirement
        if retired is None:
            return False  # someone else resumed it while we waited for the lease
        policy = self._lifecycle.policies.for_session(s)
        pointers = retired.archives or await self._pipeline.archives(session_id)
        turns: list[Message] = []
        for pointer in sorted(pointers, key=lambda p: p.last_seq, reverse=True):
            need = policy.resume_turns - len(turns)
            if need <= 0:
                break
            turns = await self._pipeline.archive.read_messages(pointer, session_id, need) + turns
        await self._store.restore(session_id, turns)
        await self._lifecycle.reactivate(session_id)
        await self._pipeline.checkpoints.restore(session_id, retired.checkpoints_uri)  # framework state
        event = pending(EventType.RESUMED, now_ms(), turns=str(len(turns)))
        await self._store.finish_resume(s, now_ms(), event)
        await self._lifecycle.events.relay(session_id)
        return True
