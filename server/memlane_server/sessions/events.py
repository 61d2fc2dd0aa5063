"""Lifecycle events: a capped Redis stream every sidecar appends to and ``WatchSessionEvents`` reads.

A stream rather than pub/sub so a watcher that reconnects can resume after the last event it saw, and so
an event emitted by one sidecar reaches watchers connected to another. Events are written atomically with
their state change into an outbox and relayed here exactly once (sessions/outbox.py): a sidecar that dies
between the two loses nothing and duplicates nothing.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis.asyncio as aioredis

from .. import linear_regex
from ..errors import InvalidArgument
from ..keyspace import KeySpace
from . import scripts
from .model import PromotionState, Session, SessionStatus
from .outbox import RELAYED_WINDOW_MS, PendingEvent, decode_entry, encode_entry, new_event_id

log = logging.getLogger("memlane.events")

_EVENT_ID = linear_regex.compile(r"[0-9]{1,20}(-[0-9]{1,20})?")


class EventType(enum.IntEnum):
    """Values match ``memlane.v1.SessionEventType``."""

    UNSPECIFIED = 0
    IDLE = 1
    CLOSED = 2
    EXPIRED = 3
    PROMOTED = 4
    ARCHIVED = 5
    RETIRED = 6
    RESUMED = 7
    PARKED = 8


def check_event_id(event_id: str, field: str = "after_event_id") -> None:
    """Empty, or a stream id: ``ms`` or ``ms-seq``, each part an unsigned 64-bit number. Anything else
    would reach Redis and fail there (a trailing newline passes ``re.match`` with ``$``)."""
    if not event_id:
        return
    if not _EVENT_ID.fullmatch(event_id) or any(int(p) >= 2**64 for p in event_id.split("-")):
        raise InvalidArgument(f"{field} {event_id[:64]!r} is not a stream id (ms or ms-seq)")


def pending(type_: EventType, at_ms: int, **detail: str) -> PendingEvent:
    """An event to write with a state change (the store's ``event=`` arguments)."""
    return PendingEvent(int(type_), at_ms, dict(detail))


@dataclass(slots=True)
class SessionEvent:
    type: EventType
    session_id: str
    user_id: str = ""
    channel: str = ""
    status: SessionStatus = SessionStatus.UNSPECIFIED
    promotion_state: PromotionState = PromotionState.UNSPECIFIED
    at_ms: int = 0
    detail: dict[str, str] = field(default_factory=dict)
    event_id: str = ""  # the stream id, set when read back

    @classmethod
    def of(cls, type_: EventType, s: Session, at_ms: int, **detail: str) -> SessionEvent:
        return cls(
            type_, s.session_id, s.user_id, s.channel, s.status, s.promotion_state, at_ms, dict(detail)
        )


class EventLog:
    def __init__(self, redis: aioredis.Redis, keys: KeySpace, *, max_len: int) -> None:
        self._redis = redis
        self._keys = keys
        self._key = keys.events()
        self._max_len = max_len
        self._relay = redis.register_script(scripts.RELAY)
        self._forget_due = redis.register_script(scripts.FORGET_DUE)

    # ------------------------------------------------------------------ the outbox relay

    async def relay(self, session_id: str) -> int:
        """Moves the session's outbox to the stream (after the state change that wrote it); returns how
        many entries it handled. A failure leaves the entries for the sweeper; it is logged, not raised:
        the events are durable already and the state change succeeded."""
        try:
            return await self._relay_list(self._keys.outbox(session_id))
        except Exception:
            log.warning("event relay failed; the sweeper will relay", exc_info=True)
            return 0

    async def relay_due(self, now_ms: int, limit: int = 500) -> int:
        """The sweeper's backstop: relays the outboxes whose writer reserved them more than a grace period
        ago (it may have died), and the session-end queue's outbox. Returns how many events it handled."""
        n = await self._relay_list(self._keys.session_end_outbox())
        due: Any = await self._redis.zrangebyscore(
            self._keys.outbox_due(), "-inf", now_ms, start=0, num=limit, withscores=True
        )
        for raw, score in due:
            sid = raw.decode()
            n += await self._relay_list(self._keys.outbox(sid))
            await self._forget_due(keys=[self._keys.outbox_due()], args=[sid, int(score)])
        return n

    async def _relay_list(self, key: str) -> int:
        rows: Any = await self._redis.lrange(key, 0, -1)
        for raw in rows:
            fields = decode_entry(raw)
            flat: list[Any] = []
            for name, value in fields.items():
                flat += [name, value]
            now = time.time_ns() // 1_000_000
            await self._relay(
                keys=[self._key, self._keys.relayed_events()],
                args=[fields["e"], now, RELAYED_WINDOW_MS, self._max_len, *flat],
            )
            await self._redis.lrem(key, 1, raw)
        return len(rows)

    def queue_entry(self, ev: SessionEvent) -> bytes:
        """An outbox entry for the session-end queue's outbox (written in the queue's own MULTI)."""
        return encode_entry(
            {
                "e": new_event_id(),
                "t": str(int(ev.type)),
                "s": ev.session_id,
                "u": ev.user_id,
                "c": ev.channel,
                "st": str(int(ev.status)),
                "p": str(int(ev.promotion_state)),
                "at": str(ev.at_ms),
                "d": orjson.dumps(ev.detail).decode(),
            }
        )

    async def relay_queue(self) -> int:
        """Relays the session-end queue's outbox (after a job was parked)."""
        try:
            return await self._relay_list(self._keys.session_end_outbox())
        except Exception:
            log.warning("event relay failed; the sweeper will relay", exc_info=True)
            return 0

    @staticmethod
    def _decode(event_id: bytes, f: dict[bytes, bytes]) -> SessionEvent:
        return SessionEvent(
            type=EventType(int(f[b"t"])),
            session_id=f[b"s"].decode(),
            user_id=f[b"u"].decode(),
            channel=f[b"c"].decode(),
            status=SessionStatus(int(f[b"st"] or 0)),
            promotion_state=PromotionState(int(f[b"p"] or 0)),
            at_ms=int(f[b"at"]),
            detail=orjson.loads(f[b"d"]),
            event_id=event_id.decode(),
        )

    async def history(self, count: int = 10_000) -> list[SessionEvent]:
        """The retained events, oldest first (for operators and tests)."""
        rows: Any = await self._redis.xrange(self._key, count=count)
        return [self._decode(i, f) for i, f in rows]

    async def follow(
        self,
        *,
        user_id: str = "",
        channel: str = "",
        types: Collection[EventType] = (),
        after_id: str = "",
        block_ms: int = 1000,
    ) -> AsyncIterator[SessionEvent]:
        """Yields matching events forever, starting after ``after_id`` ("": now, "0": the oldest retained).

        Each wait is a bounded XREAD BLOCK so cancellation (the caller hung up) lands within ``block_ms``.
        """
        check_event_id(after_id)
        cursor = after_id
        if not cursor:
            # "$" would skip events emitted between two XREAD calls; pin the cursor to the newest id now.
            last: Any = await self._redis.xrevrange(self._key, count=1)
            cursor = last[0][0].decode() if last else "0"
        wanted = frozenset(types)
        while True:
            batches: Any = await self._redis.xread({self._key: cursor}, count=256, block=block_ms)
            for _, rows in batches or []:
                for event_id, f in rows:
                    cursor = event_id.decode()
                    ev = self._decode(event_id, f)
                    if user_id and ev.user_id != user_id:
                        continue
                    if channel and ev.channel != channel:
                        continue
                    if wanted and ev.type not in wanted:
                        continue
                    yield ev
