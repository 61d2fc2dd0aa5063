"""The session store's lifecycle writes: status and promotion transitions, retirement and resumption of
the document, each with its event written in the same script (sessions/outbox.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from functools import cached_property
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from ..errors import Unavailable
from .codec import (
    LEGACY_FIELD,
    LIFECYCLE_FIELDS,
    RETIREMENT_FIELDS,
    decode_retirement,
    encode_lifecycle,
)
from .events import NO_EVENT, PendingEvent
from .lifecycle_scripts import RESUME_EXPIRED, RETIME
from .model import (
    PromotionState,
    Retirement,
    Session,
    SessionStatus,
)
from .store_base import StoreBase, now_ms

# Status transitions a caller may ask for (UpdateSession / CloseSession); the lifecycle moves the rest.
_ENDED = (SessionStatus.CLOSED, SessionStatus.EXPIRED)


class LifecycleOps(StoreBase):
    async def transition(
        self,
        session_id: str,
        to: SessionStatus,
        allowed_from: Iterable[SessionStatus],
        ts_field: str = "",
        *,
        event: PendingEvent | None = None,
        event_from: Iterable[SessionStatus] = (),
        untrack: bool = True,
    ) -> SessionStatus:
        """Moves the session to ``to`` if it is in one of ``allowed_from``; returns the previous status.
        Reaching CLOSED/EXPIRED removes the session from the deadline index (unless ``untrack`` is False:
        the caller still needs the entry). ``event`` is written to the session's outbox in the same script
        when the move starts from one of ``event_from``."""
        k = self.keys.session(session_id)
        head: list[Any] = [
            int(to),
            ts_field,
            event.at_ms if event is not None else now_ms(),
            ",".join(str(int(s)) for s in allowed_from),
            ",".join(str(int(s)) for s in event_from),
        ]
        prev = await self._evented(
            session_id,
            event,
            lambda ev: self._transition(keys=[k.doc, k.alive, self.keys.outbox(session_id)], args=head + ev),
        )
        if to in _ENDED and untrack:
            await self.redis.zrem(self.keys.deadlines(), session_id)
        return SessionStatus(int(prev))

    async def set_promotion_state(
        self,
        session_id: str,
        to: PromotionState,
        allowed_from: Iterable[PromotionState] = (),
        *,
        event: PendingEvent | None = None,
    ) -> PromotionState:
        """Moves the promotion state; ``event`` is written with it when the state changes."""
        k = self.keys.session(session_id)
        head: list[Any] = [int(to), ",".join(str(int(s)) for s in allowed_from)]
        prev = await self._evented(
            session_id,
            event,
            lambda ev: self._set_promotion(keys=[k.doc, self.keys.outbox(session_id)], args=head + ev),
        )
        return PromotionState(int(prev))

    async def retirement(self, session_id: str) -> Retirement | None:
        """The session's retirement record (None: hot, or unknown); one HMGET."""
        fields = [*RETIREMENT_FIELDS, LEGACY_FIELD]
        row: Any = await self.redis.hmget(self.keys.session(session_id).doc, fields)
        return decode_retirement({n: v.decode() for n, v in zip(fields, row, strict=True) if v is not None})

    async def retire_hot(
        self, s: Session, archived_through: int, retirement: Retirement, event: PendingEvent
    ) -> bool:
        """Drops the messages and traces of the archived session ``s``, keeping a stub with
        ``retirement``, unless anything was written since the archive; writes ``event`` if it did."""
        sid = s.session_id
        k = self.keys.session(sid)
        keys = [k.doc, k.messages, k.order, k.traces, k.trace_data, self.keys.outbox(sid)]
        fields: list[Any] = []
        for name, value in encode_lifecycle(s.policy, retirement, s.resumed_at_ms).items():
            fields += [name, value]
        done = await self._evented(
            sid, event, lambda ev: self._retire(keys=keys, args=[archived_through, *ev, *fields])
        )
        self._memo.document_changed(sid)
        return bool(done)

    async def finish_resume(self, s: Session, resumed_at_ms: int, event: PendingEvent) -> None:
        """Clears the retirement of ``s`` (resumption's last step) and records when, with ``event``."""
        keys = [self.keys.session(s.session_id).doc, self.keys.outbox(s.session_id)]
        kept = encode_lifecycle(s.policy, None, resumed_at_ms)
        fields: list[Any] = []
        for name, value in kept.items():
            fields += [name, value]
        gone = " ".join(n for n in LIFECYCLE_FIELDS if n not in kept)
        await self._evented(
            s.session_id, event, lambda ev: self._set_lifecycle(keys=keys, args=[*ev, gone, *fields])
        )

    async def resume_expired(self, session_id: str, event: PendingEvent) -> SessionStatus:
        """EXPIRED -> ACTIVE with ``event``, a fresh promotion state and the inactivity clock running
        again; returns the previous status (only EXPIRED means this call moved it)."""
        k = self.keys.session(session_id)
        keys = [k.doc, k.alive, self.keys.outbox(session_id)]
        prev = await self._evented(
            session_id, event, lambda ev: self._resume_expired(keys=keys, args=[event.at_ms, *ev])
        )
        return SessionStatus(int(prev))

    async def retime(self, session_id: str) -> None:
        """After UpdateSession changed ``ttl_seconds``: the running inactivity clock and the sweeper's
        deadline entry follow the document's new timeout (counted from the last activity), so a shorter
        one brings the expiry forward instead of waiting out the old one."""
        k = self.keys.session(session_id)
        try:
            deadline = int(await self._retime(keys=[k.doc, k.alive], args=[now_ms()]))
        except ResponseError as exc:
            raise self._script_error(exc, session_id) from exc
        self._memo.deadline_moved(session_id)  # its last bump may lie past the new deadline
        if deadline > 0:
            await self.redis.zadd(self.keys.deadlines(), {session_id: deadline})
        elif deadline == -1:
            await self.redis.zrem(self.keys.deadlines(), session_id)  # no timeout: never the sweeper's

    @cached_property
    def _resume_expired(self) -> AsyncScript:
        return self.redis.register_script(RESUME_EXPIRED)

    @cached_property
    def _retime(self) -> AsyncScript:
        return self.redis.register_script(RETIME)

    async def _evented(
        self, session_id: str, event: PendingEvent | None, run: Callable[[list[Any]], Awaitable[Any]]
    ) -> Any:
        """Runs a state-changing script with its event's ARGV: reserves the outbox pointer first, and
        again if the script found the reservation too old (FENCE: this writer stalled)."""
        for _ in range(3):
            ev = list(NO_EVENT) if event is None else await self._outbox.reserve(session_id, event, now_ms())
            try:
                return await run(ev)
            except ResponseError as exc:
                if str(exc).startswith("FENCE"):
                    continue
                raise self._script_error(exc, session_id) from exc
        raise Unavailable(f"session {session_id!r}: event write kept missing its fence; retry")
