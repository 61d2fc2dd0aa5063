"""What the append path remembers of each session between appends, so an append stays one round trip.

Two per-process facts, owned here and changed nowhere else: the few document fields an append needs
(timeout, model, topology, group: they change rarely) and the deadline this process last wrote to the
sweeper's index (moved only once a tenth of the timeout has passed). The store's other writers do not
touch them; they say what changed (``document_changed``, ``deadline_moved``, ``forget``).
"""

from __future__ import annotations

from typing import NamedTuple, cast

import redis.asyncio as aioredis

from ..keyspace import KeySpace
from .model import Topology

# Each memo holds at most this many sessions; past it, it starts afresh (a miss costs one read).
_MAX_SESSIONS = 10_000


class AppendMeta(NamedTuple):
    ttl_seconds: int
    model: str
    topology: Topology
    group: str


class AppendMemo:
    def __init__(self, redis: aioredis.Redis, keys: KeySpace) -> None:
        self._redis = redis
        self._keys = keys
        self._meta: dict[str, AppendMeta] = {}
        self._deadline: dict[str, int] = {}

    async def meta(self, session_id: str) -> AppendMeta:
        """The document fields an append needs: remembered, else one HMGET (a missing document is not
        remembered, so the append script reports it)."""
        meta = self._meta.get(session_id)
        if meta is None:
            ttl, model, topology, group = cast(
                list[bytes | None],
                await self._redis.hmget(
                    self._keys.session(session_id).doc, ["ttl_seconds", "model", "topology", "group"]
                ),
            )
            meta = AppendMeta(
                int(ttl or 0),
                (model or b"").decode(),
                Topology(int(topology or Topology.SHARED)),
                (group or b"").decode(),
            )
            if ttl is not None:
                if len(self._meta) > _MAX_SESSIONS:
                    self._meta.clear()
                self._meta[session_id] = meta
        return meta

    async def bump_deadline(self, session_id: str, deadline_ms: int, ttl_s: int) -> None:
        """Keeps the sweeper's deadline index roughly current without a write per append: the entry moves
        only once a tenth of the TTL has passed since it was last moved. An entry may therefore be early,
        never late; the sweeper confirms with the ``alive`` key (which every append refreshes exactly)
        before it ends a session."""
        last = self._deadline.get(session_id, 0)
        if deadline_ms - last < ttl_s * 100:
            return
        if len(self._deadline) > _MAX_SESSIONS:
            self._deadline.clear()
        self._deadline[session_id] = deadline_ms
        # The append script has just proved the session exists; a session revived after expiry
        # re-enters the index here.
        await self._redis.zadd(self._keys.deadlines(), {session_id: deadline_ms})

    def document_changed(self, session_id: str) -> None:
        """The document's fields may differ now (UpdateSession, retirement, another sidecar's timeout)."""
        self._meta.pop(session_id, None)

    def deadline_moved(self, session_id: str) -> None:
        """The index entry was rewritten elsewhere (a new timeout): the next append writes it again."""
        self._deadline.pop(session_id, None)

    def forget(self, session_id: str) -> None:
        """The session is gone (erasure): nothing of it is remembered."""
        self._meta.pop(session_id, None)
        self._deadline.pop(session_id, None)
