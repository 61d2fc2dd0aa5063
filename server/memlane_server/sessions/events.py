"""Lifecycle events: a capped Redis stream every sidecar appends to and ``WatchSessionEvents`` reads, and
the outbox that writes each event atomically with its state change.

A stream rather than pub/sub so a watcher that reconnects can resume after the last event it saw, and so
an event emitted by one sidecar reaches watchers connected to another. Events are written atomically with
their state change into an outbox and relayed here exactly once: a sidecar that dies between the two
loses nothing and duplicates nothing.

The outbox: the events stream is one key (``KeySpace.events``) on its own hash slot, so on Redis Cluster
no script can change a session and append to the stream at once, and a sidecar killed between the two
used to lose the event. Instead the script that changes the session also pushes the event onto the
session's own outbox (``KeySpace.outbox``, a LIST in the session's slot). The event is durable the moment
the state change is; moving it to the stream (``EventLog.relay``) is separate and may happen twice:

- **exactly once for consumers**: every event carries a random id (``uid``); the relay script, on the
  stream's slot, appends an event only if its id is not in the relayed set (``KeySpace.relayed_events``,
  ids kept for ``RELAYED_WINDOW_MS``), then the relayer removes the entry from the outbox. A relayer that
  dies in between leaves an entry whose second relay appends nothing.
- **nothing left behind**: before the script runs, the writer adds the session to ``KeySpace.outbox_due``
  scored ``now + GRACE_MS`` (write-ahead, so a crash after the script still leaves a pointer). The
  sweeper relays the outboxes of due entries and drops an entry only if its score is unchanged (no newer
  writer). A script refuses (``FENCE``) to push an event once Redis' clock passes ``score - GRACE_MS/2``,
  so no writer the sweeper has given up on can still push: the writer reserves again and retries. Clocks
  of sidecars and Redis nodes may disagree by up to ``GRACE_MS/2`` without breaking this.

The writer that made the change relays at once (watchers see the event within a round trip); the sweeper
is the backstop, so an event whose writer died reaches the stream within about ``GRACE_MS``.
"""

from __future__ import annotations

import enum
import logging
import time
import uuid
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

log = logging.getLogger("memlane.events")

_EVENT_ID = linear_regex.compile(r"[0-9]{1,20}(-[0-9]{1,20})?")


# ---------------------------------------- the outbox (see the module docstring)

GRACE_MS = 10_000
# How long a relayed event id is remembered: far longer than an outbox entry can wait for the sweeper
# (GRACE_MS plus a sweep), bounded so the set stays small (about 60 bytes per event).
RELAYED_WINDOW_MS = 3_600_000

# An outbox entry: a JSON array of strings in this order (pushed by Lua's cjson or by ``encode_entry``).
ENTRY_FIELDS = ("e", "t", "s", "u", "c", "st", "p", "at", "d")

# ARGV of a script that writes no event (see scripts.EVENT_LIB).
NO_EVENT: tuple[str, ...] = ("", "", "", "", "", "")


@dataclass(frozen=True, slots=True)
class PendingEvent:
    """An event to write with a state change; session, user, channel and states are read in the script."""

    type: int  # an EventType value
    at_ms: int
    detail: dict[str, str] = field(default_factory=dict)


def encode_entry(fields: dict[str, str]) -> bytes:
    """An outbox entry written from Python (events not tied to one session's state, e.g. PARKED)."""
    return orjson.dumps([str(fields.get(k, "")) for k in ENTRY_FIELDS])


def decode_entry(raw: bytes) -> dict[str, str]:
    """Stream fields of an outbox entry (``e`` is the event's unique id)."""
    values = orjson.loads(raw)
    return {k: str(v) for k, v in zip(ENTRY_FIELDS, values, strict=True)}


def new_event_id() -> str:
    return uuid.uuid4().hex


class OutboxWriter:
    """The write-ahead half: reserves the session's outbox pointer and builds the script's event ARGV."""

    def __init__(self, redis: aioredis.Redis, keys: KeySpace) -> None:
        self._redis = redis
        self._keys = keys

    async def reserve(self, session_id: str, event: PendingEvent, now_ms: int) -> list[Any]:
        score = now_ms + GRACE_MS
        await self._redis.zadd(self._keys.outbox_due(), {session_id: score}, gt=True)
        detail = orjson.dumps(event.detail).decode()
        return [new_event_id(), int(event.type), session_id, event.at_ms, detail, score - GRACE_MS // 2]


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
