"""A per-user version of long-term memory, kept in Redis so every sidecar sharing the stores sees it.

The LTM service bumps it after each write that changes what a user's reads return (create, merge,
supersede, update, delete, feedback, pruning, erasure). Assembly reads it before using anything cached
about the user: a cached profile made at another version is stale, and so is this sidecar's LanceDB
handle (it does not see other processes' writes until refreshed).
"""

from __future__ import annotations

import logging
import os
from typing import cast

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from ..infra.redis_lane import hot
from .keys import KeySpace

log = logging.getLogger("memlane.context")

# A version is a fresh random token, never a counter, and never "absent": a reader that finds no key
# (expired, or deleted by erasure, since its name holds the user id) claims a fresh token first. So a
# version some sidecar remembered can never come back, and the next assembly after any change or
# erasure sees a new one. The TTL only tidies up users nobody reads.
VERSION_TTL_S = 86_400


class LtmVersions:
    def __init__(self, redis: aioredis.Redis, keys: KeySpace) -> None:
        self._redis = redis
        self._keys = keys

    async def bump(self, user_id: str, removed: bool = False) -> None:
        """After a write; ``removed``: it deleted rows (a delete, pruning, erasure, a restore), which a
        reader cannot see in what changed since its view and must reload for. A failure is logged, not
        raised: the write itself landed, and cached profiles expire within seconds anyway (a Redis that
        is down fails the next assembly first)."""
        token = os.urandom(12)
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(self._keys.ltm_version(user_id), token, ex=VERSION_TTL_S)
                if removed:
                    pipe.set(self._keys.ltm_removals(user_id), token, ex=VERSION_TTL_S)
                await pipe.execute()
        except RedisError as exc:
            log.warning("ltm version bump failed", extra={"detail": str(exc)})

    async def read(self, user_id: str) -> tuple[bytes, bytes]:
        """The user's current version and removals token (one MGET; three more round trips only when
        the version is missing). A missing version (erased with the user, or expired) counts as a
        removal too: the fresh version it is replaced by becomes the removals token as well, so no
        reader catches up across an erasure."""
        key, removals = self._keys.ltm_version(user_id), self._keys.ltm_removals(user_id)
        raw, gone = cast(list[bytes | None], await hot(self._redis, "MGET", key, removals))  # per assembly
        if raw is None:
            await self._redis.set(key, os.urandom(12), ex=VERSION_TTL_S, nx=True)
            raw = cast(bytes | None, await self._redis.get(key)) or b""
            await self._redis.set(removals, raw, ex=VERSION_TTL_S)  # racers read and write the same
            gone = raw
        return raw, gone or b""
