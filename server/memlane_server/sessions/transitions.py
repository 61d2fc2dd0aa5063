"""The session store's lifecycle writes (``SessionTransitions``, a collaborator of ``SessionStore``):
status and promotion transitions, retirement and resumption of the document, each with its event
written in the same script (the outbox, ``events.py``), and the inactivity clock re-armed when the
timeout changes. The Lua of the two moves outside the end pipeline (an expired session taken up again
by an append; a timeout changed by UpdateSession) sits here with them; the others are ``scripts.py``'s."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from ..errors import Unavailable
from ..keyspace import KeySpace
from . import scripts
from .codec import (
    LEGACY_FIELD,
    LIFECYCLE_FIELDS,
    RETIREMENT_FIELDS,
    decode_retirement,
    encode_lifecycle,
)
from .events import NO_EVENT, OutboxWriter, PendingEvent
from .messages import AppendMemo, now_ms
from .model import (
    PromotionState,
    Retirement,
    Session,
    SessionStatus,
)
from .scripts import EVENT_LIB, fill_statuses, script_error

# Status transitions a caller may ask for (UpdateSession / CloseSession); the lifecycle moves the rest.
_ENDED = (SessionStatus.CLOSED, SessionStatus.EXPIRED)

# KEYS: doc, alive, outbox.  ARGV: now_ms, then the RESUMED event (base 2).
# EXPIRED -> ACTIVE with a fresh promotion state (the next end runs the pipeline for the new turns), the
# inactivity clock running again from now, and the event, in one step. Returns the previous status: only
# EXPIRED means this call moved it (another caller may have revived or closed it first).
RESUME_EXPIRED = EVENT_LIB + fill_statuses(
    r"""
local st = redis.call('HMGET', KEYS[1], 'status', 'ttl_seconds')
if not st[1] then return redis.error_reply('NOTFOUND') end
if st[1] ~= '$EXPIRED' then return tonumber(st[1]) end
if event_fenced(2) then return redis.error_reply('FENCE') end
redis.call('HSET', KEYS[1], 'status', '$ACTIVE', 'promotion_state', '$P_NONE', 'last_activity_at_ms', ARGV[1])
local ttl = tonumber(st[2] or '0') * 1000
if ttl > 0 then redis.call('SET', KEYS[2], '1', 'PX', ttl) end
event_push(KEYS[3], KEYS[1], 2)
return tonumber(st[1])
"""
)

# KEYS: doc, alive.  ARGV: now_ms.
# Re-arms a live session's inactivity clock after its timeout changed: it now runs out at the last activity
# plus the document's ttl_seconds (at once if that is past: 1 ms, so Redis expires the key and sends the
# expiry event), and a timeout of 0 stops it. Returns the new deadline (ms), -1 for no timeout, -2 for a
# session that has ended (no clock to move).
RETIME = fill_statuses(
    r"""
local st = redis.call('HMGET', KEYS[1], 'status', 'ttl_seconds', 'last_activity_at_ms')
if not st[1] then return redis.error_reply('NOTFOUND') end
if st[1] ~= '$ACTIVE' and st[1] ~= '$IDLE' then return -2 end
local ttl = tonumber(st[2] or '0') * 1000
if ttl <= 0 then
  redis.call('PERSIST', KEYS[2])
  return -1
end
local now = tonumber(ARGV[1])
local left = tonumber(st[3] or ARGV[1]) + ttl - now
if left < 1 then left = 1 end
redis.call('SET', KEYS[2], '1', 'PX', left)
return now + left
"""
)


class SessionTransitions:
    def __init__(self, redis: aioredis.Redis, keys: KeySpace, memo: AppendMemo) -> None:
        self.redis = redis
        self.keys = keys
        self._memo = memo  # told when a move changed the document or its deadline (messages.py owns it)
        self._outbox = OutboxWriter(redis, keys)
        self._transition = redis.register_script(scripts.TRANSITION)
        self._set_promotion = redis.register_script(scripts.SET_PROMOTION)
        self._retire = redis.register_script(scripts.RETIRE)
        self._set_lifecycle = redis.register_script(scripts.SET_LIFECYCLE)
        self._resume_expired = redis.register_script(RESUME_EXPIRED)
        self._retime = redis.register_script(RETIME)

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
            raise script_error(exc, session_id) from exc
        self._memo.deadline_moved(session_id)  # its last bump may lie past the new deadline
        if deadline > 0:
            await self.redis.zadd(self.keys.deadlines(), {session_id: deadline})
        elif deadline == -1:
            await self.redis.zrem(self.keys.deadlines(), session_id)  # no timeout: never the sweeper's

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
                raise script_error(exc, session_id) from exc
        raise Unavailable(f"session {session_id!r}: event write kept missing its fence; retry")
