"""Turn traces in Redis, under the session's own keys (so retention and erasure treat them like messages).

``traces`` is a ZSET of trace ids scored by creation time (ms); ``trace_data`` a HASH of id -> the
trace's JSON (encoded by context/traces.py, opaque here). Each session keeps at most ``max_per_session``
traces; the oldest are trimmed by the same script that stores a new one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from ..infra.redis_lane import hot
from ..keyspace import KeySpace
from . import scripts
from .codec import decode_message
from .model import Message


class TraceRecords:
    def __init__(self, redis: aioredis.Redis, keys: KeySpace, max_per_session: int = 500) -> None:
        self._redis = redis
        self._keys = keys
        self._max = max_per_session
        self._put = redis.register_script(scripts.PUT_TRACE)

    async def put(self, session_id: str, trace_id: str, payload: bytes | str, created_at_ms: int) -> None:
        """Once per assembly: a bare EVALSHA on the hot lane (a trace id is written once, so a resend
        writes the same bytes); on NOSCRIPT the script is loaded and the command resent."""
        k = self._keys.session(session_id)
        cmd = (
            "EVALSHA",
            self._put.sha,
            2,
            k.trace_data,
            k.traces,
            trace_id,
            payload,
            created_at_ms,
            self._max,
        )
        try:
            await hot(self._redis, *cmd)
        except NoScriptError:
            await self._redis.script_load(scripts.PUT_TRACE)
            await hot(self._redis, *cmd)

    async def get(self, session_id: str, trace_id: str) -> bytes | None:
        raw: Any = await self._redis.hget(self._keys.session(session_id).trace_data, trace_id)
        return raw if raw is None else bytes(raw)

    async def newest(
        self, session_id: str, count: int, before: tuple[int, str] | None
    ) -> list[tuple[str, int]]:
        """(trace id, created ms) newest first: the first ``count + 1`` from the top, or, after a cursor
        ``before`` = (score, id), up to ``count + 64`` at or below its score with same-ms neighbours at or
        after the cursor's id left out."""
        k = self._keys.session(session_id)
        found: Any  # redis-py types replies loosely; this client returns bytes (decode_responses=False)
        if before is None:
            found = await self._redis.zrevrange(k.traces, 0, count, withscores=True)
            return [(tid.decode(), int(s)) for tid, s in found]
        score, last_id = before
        found = await self._redis.zrevrangebyscore(
            k.traces, score, "-inf", start=0, num=count + 64, withscores=True
        )
        rows = [(tid.decode(), int(s)) for tid, s in found]
        return [(tid, s) for tid, s in rows if s < score or tid < last_id]

    async def payloads(self, session_id: str, trace_ids: Sequence[str]) -> list[bytes | None]:
        raws: Any = await self._redis.hmget(self._keys.session(session_id).trace_data, list(trace_ids))
        return [None if r is None else bytes(r) for r in raws]

    async def all(self, session_id: str) -> list[tuple[str, int, str]]:
        """Every stored trace (id, created ms, JSON), oldest first: what the archive keeps."""
        k = self._keys.session(session_id)
        rows: Any = await self._redis.zrange(k.traces, 0, -1, withscores=True)
        if not rows:
            return []
        payloads: Any = await self._redis.hmget(k.trace_data, [r[0] for r in rows])
        return [
            (tid.decode(), int(score), p.decode())
            for (tid, score), p in zip(rows, payloads, strict=True)
            if p is not None
        ]

    async def messages(self, session_id: str, message_ids: Sequence[str]) -> dict[str, Message]:
        """The stored messages among ``message_ids`` (those retired or removed since are absent)."""
        ids = list(message_ids)
        k = self._keys.session(session_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hmget(k.messages, ids)
            pipe.zmscore(k.order, ids)
            payloads, seqs = await pipe.execute()
        return {
            mid: decode_message(session_id, mid, int(seq), raw)
            for mid, raw, seq in zip(ids, payloads, seqs, strict=True)
            if raw and seq is not None
        }
