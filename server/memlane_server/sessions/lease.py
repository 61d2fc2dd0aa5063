"""A per-session lease: one sidecar at a time runs, resumes or retires a given session. Also the lock
of the shared LTM table (``LeaseLock``): one sidecar at a time compacts, indexes or erases it.

``SET key token NX PX`` to take it; renew and release only while the token is still ours (a lease that
ran out and was taken by another sidecar is never extended or deleted by the old holder).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator

import redis.asyncio as aioredis

_RENEW = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
)
log = logging.getLogger(__name__)
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


class LeaseLock:
    """``ltm.sharing.TableLock`` on a Redis lease, renewed while held: every sidecar sharing the Redis
    key prefix (and so the LTM table) takes turns. A holder that dies frees it within ``ttl_ms``."""

    def __init__(self, redis: aioredis.Redis, key: str, ttl_ms: int = 30_000) -> None:
        self._redis = redis
        self._key = key
        self._ttl_ms = ttl_ms

    @contextlib.asynccontextmanager
    async def hold(self, wait_s: float) -> AsyncIterator[bool]:
        lease = Lease(self._redis, self._key, self._ttl_ms)
        if not await lease.acquire(wait_s):
            yield False
            return
        keeper = asyncio.create_task(self._keep(lease))
        try:
            yield True
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            await lease.release()

    async def _keep(self, lease: Lease) -> None:
        while True:
            await asyncio.sleep(self._ttl_ms / 3000)
            if not await lease.renew():
                # A LanceDB commit cannot be interrupted safely: finish, and say the guarantee lapsed.
                log.warning("lock %s lapsed while held (Redis unreachable past its TTL?)", self._key)
                return
