"""The event outbox: a lifecycle state change and its event are one atomic write.

The events stream is one key (``KeySpace.events``) on its own hash slot, so on Redis Cluster no script
can change a session and append to the stream at once, and a sidecar killed between the two used to lose
the event. Instead the script that changes the session also pushes the event onto the session's own
outbox (``KeySpace.outbox``, a LIST in the session's slot). The event is durable the moment the state
change is; moving it to the stream (``EventLog.relay``) is separate and may happen twice:

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

import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis.asyncio as aioredis

from ..keyspace import KeySpace

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
