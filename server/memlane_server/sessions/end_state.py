"""What the session-end pipeline keeps in Redis besides the session document (pipelines/session_end.py).

- ``KeySpace.pipeline``: a HASH of per-step through-seqs and the archive pointers (``EndProgress``);
- ``KeySpace.promoted``: the SET of long-term memory ids promoted from the session;
- ``KeySpace.retire_due``: when each archived session's hot data may leave Redis;
- the per-session lease and the named job locks that keep two sidecars off the same work.

Every write that must land with another (messages dropped and the step recorded, memories and the
through-seq) is one MULTI on the session's slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis.asyncio as aioredis

from ..keyspace import KeySpace
from .lease import Lease


@dataclass(slots=True)
class EndProgress:
    """How far each step of the pipeline got (seqs, inclusive), and the archive parts written so far."""

    discarded_through: int = 0
    promoted_through: int = 0
    archived_through: int = 0
    archives: list[dict[str, Any]] = field(default_factory=list)  # ArchivePointer records

    @classmethod
    def decode(cls, raw: dict[bytes, bytes]) -> EndProgress:
        g = {k.decode(): v.decode() for k, v in raw.items()}
        records = orjson.loads(g["archives"]) if g.get("archives") else []
        return cls(
            discarded_through=int(g.get("discarded_through", 0)),
            promoted_through=int(g.get("promoted_through", 0)),
            archived_through=int(g.get("archived_through", 0)),
            archives=[r for r in records if isinstance(r, dict)],
        )


class EndState:
    def __init__(self, redis: aioredis.Redis, keys: KeySpace) -> None:
        self._redis = redis
        self._keys = keys

    async def progress(self, session_id: str) -> EndProgress:
        raw: Any = await self._redis.hgetall(self._keys.pipeline(session_id))
        return EndProgress.decode(raw)

    async def archive_records(self, session_id: str) -> list[dict[str, Any]]:
        raw: Any = await self._redis.hget(self._keys.pipeline(session_id), "archives")
        return [r for r in orjson.loads(raw) if isinstance(r, dict)] if raw else []

    async def promoted_ids(self, session_id: str) -> list[str]:
        members: Any = await self._redis.smembers(self._keys.promoted(session_id))
        return sorted(m.decode() for m in members)

    async def discard(self, session_id: str, message_ids: Sequence[str], through: int) -> None:
        """Drops transient messages from Redis and records the step, atomically."""
        k = self._keys.session(session_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            if message_ids:
                pipe.hdel(k.messages, *message_ids)
                pipe.zrem(k.order, *message_ids)
            pipe.hset(self._keys.pipeline(session_id), "discarded_through", through)
            await pipe.execute()

    async def record_promoted(self, session_id: str, memory_ids: Sequence[str], through: int) -> None:
        """Memories promoted from a chunk and the chunk's last seq, atomically."""
        async with self._redis.pipeline(transaction=True) as pipe:
            if memory_ids:
                pipe.sadd(self._keys.promoted(session_id), *memory_ids)
            pipe.hset(self._keys.pipeline(session_id), "promoted_through", through)
            await pipe.execute()

    async def record_archive(self, session_id: str, through: int, records: list[dict[str, Any]]) -> None:
        await self._redis.hset(
            self._keys.pipeline(session_id),
            mapping={"archived_through": through, "archives": orjson.dumps(records).decode()},
        )

    # ------------------------------------------------------------------ retirement schedule

    async def schedule_retire(self, session_id: str, at_ms: int) -> None:
        await self._redis.zadd(self._keys.retire_due(), {session_id: at_ms})

    async def unschedule_retire(self, session_id: str) -> None:
        await self._redis.zrem(self._keys.retire_due(), session_id)

    async def due_retirements(self, now_ms: int, limit: int) -> list[str]:
        due: Any = await self._redis.zrangebyscore(
            self._keys.retire_due(), "-inf", now_ms, start=0, num=limit
        )
        return [d.decode() for d in due]

    # ------------------------------------------------------------------ leases and locks

    def lease(self, session_id: str, ttl_ms: int) -> Lease:
        return Lease(self._redis, self._keys.lease(session_id), ttl_ms)

    async def leased(self, session_id: str) -> bool:
        """Whether some sidecar holds the session's lease right now."""
        return bool(await self._redis.exists(self._keys.lease(session_id)))

    async def take_job_lock(self, name: str, owner: str, ttl_ms: int) -> bool:
        """One sidecar per ``ttl_ms`` runs the named periodic job; True if this one may."""
        return bool(await self._redis.set(self._keys.job_lock(name), owner, nx=True, px=ttl_ms))
