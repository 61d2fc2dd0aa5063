"""Resumption: a retired session comes back from the archive when someone uses it again, and an expired
one is taken up again when someone appends to it (``revive``: ACTIVE, with a RESUMED event; AppendMessages
calls it when the store's append met the session expired, then appends again).

``ensure_hot(session_id)`` is what GetSession, ListMessages and AssembleContext call first. For a session
that is not retired it costs one HGET. For a retired stub it reloads the channel's ``resume_turns`` most
recent turns and the framework's checkpoints from the archive (the summary never left the stub), makes
the session active again and clears the retired mark last, so a resumption that dies half-way is simply
redone by the next call.
"""

from __future__ import annotations

from ..errors import Unavailable
from ..sessions.events import EventType, pending
from ..sessions.lifecycle import Lifecycle
from ..sessions.model import Message, Session
from ..sessions.store import SessionStore, now_ms
from .session_end import SessionEndPipeline


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
