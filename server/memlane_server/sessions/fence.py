"""Holding a set of sessions' leases (the ones the session-end pipeline, resumption and retirement run
under) for the length of an erasure.

A session-end run that has read a session's turns writes its archive part and promotes its memories
later; an erasure that ran meanwhile would list the archive and clear LTM before those writes and leave
them behind (seen in the chaos campaign: 9 archived turns and 12 memories of an erased user). Holding
the leases makes a run in flight finish first (its writes are then erased with the rest) and keeps new
ones out until the session is gone, after which a queued job finds nothing to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence

import redis.asyncio as aioredis

from ..errors import Unavailable
from .keys import KeySpace
from .lease import Lease

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


async def _renew(leases: list[Lease]) -> None:
    while True:
        await asyncio.sleep(_TTL_MS / 3000)
        for lease in leases:
            await lease.renew()
