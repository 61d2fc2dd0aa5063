"""Cancelling a task that is talking to Redis ends it, whatever instant the cancel lands at.

redis-py writes each command under ``asyncio.wait_for``; before Python 3.12 ``wait_for`` swallows a
cancellation that arrives as the write it wraps completes, so a loop of commands (an XREAD BLOCK loop
like WatchSessionEvents, the session-end worker's periodic jobs) went on forever after its cancel and
the sidecar's shutdown waited for it (a RedisCluster test sidecar past the 60 s stop limit). The pool of
``infra/redis_pool.py`` writes under ``asyncio.timeout`` instead.
"""

from __future__ import annotations

import asyncio
import uuid

from memlane_server.infra.redis_pool import connect


async def _stuck_after_cancel(url: str, key: str) -> int:
    """Cancels an XREAD BLOCK 100 ms loop at 80 instants spread around the moment its first reply comes
    back and the next command is written; counts the tasks still running 1 s after their cancel."""
    r = connect(url)
    await r.ping()

    async def follow() -> None:
        while True:
            await r.xread({key: "0-0"}, block=100)

    stuck = 0
    for i in range(80):
        task = asyncio.create_task(follow())
        await asyncio.sleep(0.08 + i * 0.0006)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=1)
        if not done:
            stuck += 1
            task.cancel()  # a second cancel does land; do not leave it running
            await asyncio.wait({task}, timeout=1)
    await r.aclose()
    return stuck


def test_a_cancelled_command_loop_always_ends(redis_url: str) -> None:
    # Without the fix 3-5 of the 80 cancels were swallowed (single node and cluster alike). The key is
    # only read, never written.
    key = f"t{uuid.uuid4().hex[:10]}:{{cancel}}:nothing"
    assert asyncio.run(_stuck_after_cancel(redis_url, key)) == 0
