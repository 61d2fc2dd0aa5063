"""A per-session lease: one sidecar at a time runs, resumes or retires a given session.

``SET key token NX PX`` to take it; renew and release only while the token is still ours (a lease that
ran out and was taken by another sidecar is never extended or deleted by the old holder).
"""

from __future__ import annotations

import asyncio
import secrets
import time

import redis.asyncio as aioredis

_RENEW = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
)
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class Lease:
    def __init__(self, redis: aioredis.Redis, key: str, ttl_ms: int) -> None:
        self._redis = redis
        self.key = key
        self.ttl_ms = ttl_ms
        self.token = secrets.token_hex(8)
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)

    async def acquire(self, wait_s: float = 0.0) -> bool:
        deadline = time.monotonic() + wait_s
        while True:
            if await self._redis.set(self.key, self.token, nx=True, px=self.ttl_ms):
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)

    async def renew(self) -> bool:
        return bool(await self._renew(keys=[self.key], args=[self.token, self.ttl_ms]))

    async def release(self) -> None:
        await self._release(keys=[self.key], args=[self.token])
