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

from memlane_server.sessions.keys import KeySpace

log = logging.getLogger("memlane.context")

# A version is a fresh random token, never a counter: a key that expired, or that erasure deleted (it
# names the user), can never come back equal to a version some sidecar remembered. The TTL only
# tidies up users who stopped writing.
VERSION_TTL_S = 86_400


class LtmVersions:
    def __init__(self, redis: aioredis.Redis, keys: KeySpace) -> None:
        self._redis = redis
        self._keys = keys

    async def bump(self, user_id: str) -> None:
        """After a write. A failure is logged, not raised: the write itself landed, and cached profiles
        expire within seconds anyway (a Redis that is down fails the next assembly first)."""
        try:
            await self._redis.set(self._keys.ltm_version(user_id), os.urandom(12), ex=VERSION_TTL_S)
        except RedisError as exc:
            log.warning("ltm version bump failed", extra={"detail": str(exc)})

    async def read(self, user_id: str) -> bytes:
        """The user's current version; b"" when the user has no recent write."""
        raw = cast(bytes | None, await self._redis.get(self._keys.ltm_version(user_id)))
        return raw or b""
