"""A per-session lease: one sidecar at a time runs, resumes or retires a given session. Also the lock
of the shared LTM table (``LeaseLock``): one sidecar at a time compacts, indexes or erases it.

``SET key token NX PX`` to take it; renew and release only while the token is still ours (a lease that
ran out and was taken by another sidecar is never extended or deleted by the old holder).

Fences around an erasure: the sessions' leases it holds (``sessions_held``) and the journal that
makes an erasure whose sidecar died finish anyway (``ErasureJournal``).

Holding a set of sessions' leases (the ones the session-end pipeline, resumption and retirement run
under) for the length of an erasure:

A session-end run that has read a session's turns writes its archive part and promotes its memories
later; an erasure that ran meanwhile would list the archive and clear LTM before those writes and leave
them behind (seen in the chaos campaign: 9 archived turns and 12 memories of an erased user). Holding
the leases makes a run in flight finish first (its writes are then erased with the rest) and keeps new
ones out until the session is gone, after which a queued job finds nothing to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import redis.asyncio as aioredis

from ..errors import Unavailable
from ..keyspace import KeySpace

_RENEW = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
)
log = logging.getLogger("memlane_server.sessions.lease")  # its name before the merge
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

    def __init__(self, redis: aioredis.Redis, key: str, ttl_ms: int = 10_000) -> None:
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


# ---------------------------------------- fences around an erasure (see the module docstring)

_TTL_MS = 30_000  # renewed every third of it while held; a holder that dies frees them within this


@contextlib.asynccontextmanager
async def sessions_held(
    redis: aioredis.Redis, keys: KeySpace, session_ids: Sequence[str], wait_s: float = 60.0
) -> AsyncIterator[None]:
    """Takes every session's lease, waiting up to ``wait_s`` in all for runs in flight; raises
    Unavailable (retry the call) if one is still held then. Released on exit."""
    held: list[Lease] = []
    keeper: asyncio.Task[None] | None = None
    try:
        deadline = time.monotonic() + wait_s
        for sid in session_ids:
            lease = Lease(redis, keys.lease(sid), _TTL_MS)
            if not await lease.acquire(max(0.0, deadline - time.monotonic())):
                raise Unavailable(f"the session end of {sid!r} is still running; retry")
            held.append(lease)
        keeper = asyncio.create_task(_renew(held))
        yield
    finally:
        if keeper is not None:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        for lease in held:
            await lease.release()


class ErasureJournal:
    """Which erasures were started and not finished. ``running(user)`` records the erasure and holds its
    lease while the body runs, and drops both when it ends well; a sidecar killed mid-way leaves the
    record with no live lease, and ``orphans`` names it for another sidecar to run again (every step of
    an erasure is idempotent). A failed erasure keeps its record too: it is retried the same way."""

    def __init__(self, redis: aioredis.Redis, keys: KeySpace) -> None:
        self._redis = redis
        self._keys = keys

    @contextlib.asynccontextmanager
    async def running(self, user_id: str, wait_s: float = 60.0) -> AsyncIterator[None]:
        """Records the erasure and holds its lease (waiting up to ``wait_s`` for another sidecar running
        the same user's erasure, then Unavailable); the record goes only once the body returned."""
        await self._redis.hset(self._keys.erasures(), user_id, int(time.time() * 1000))
        async with LeaseLock(self._redis, self._keys.erasing(user_id), _TTL_MS).hold(wait_s) as held:
            if not held:
                raise Unavailable(f"an erasure of user {user_id!r} is still running elsewhere; retry")
            yield
            await self._redis.hdel(self._keys.erasures(), user_id)

    async def orphans(self) -> list[str]:
        """Users whose erasure was started and is run by nobody now (its sidecar died, or it failed)."""
        users: Any = await self._redis.hkeys(self._keys.erasures())
        out = []
        for raw in users:
            user = raw.decode() if isinstance(raw, bytes) else str(raw)
            if not await self._redis.exists(self._keys.erasing(user)):
                out.append(user)
        return out


async def _renew(leases: list[Lease]) -> None:
    while True:
        await asyncio.sleep(_TTL_MS / 3000)
        for lease in leases:
            await lease.renew()
