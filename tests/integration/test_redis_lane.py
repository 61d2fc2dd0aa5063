"""The hot path's pipelined Redis lane (``infra/redis_lane.py``) against a real Redis, on the stdlib
loop and on uvloop (what ``memlane serve`` runs on): concurrent commands get their own replies, error
replies raise what redis-py raises, a cancelled caller does not shift anyone's reply, a killed
connection is replaced, and a Redis nobody can reach is the pooled client's ConnectionError."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import uvloop
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from memlane_server.infra.redis_lane import as_dict, hot, lane_of
from memlane_server.infra.redis_pool import connect
from tests.conftest import delete_prefix

LOOPS: dict[str, Callable[[Coroutine[Any, Any, None]], None]] = {"asyncio": asyncio.run, "uvloop": uvloop.run}


@pytest.fixture(params=sorted(LOOPS))
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, None]], None]:
    return LOOPS[request.param]


@pytest.fixture()
def prefix(redis_url: str) -> Iterator[str]:
    if "cluster" in redis_url:
        pytest.skip("a Redis Cluster client has no lane")
    p = f"lane-{uuid.uuid4().hex[:8]}"
    yield p
    delete_prefix(redis_url, p)


def test_concurrent_commands_each_get_their_own_reply(
    redis_url: str, prefix: str, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    async def main() -> None:
        client = connect(redis_url)
        try:
            assert lane_of(client) is not None
            await client.hset(f"{prefix}:h", mapping={"a": "1", "b": "2"})
            replies = await asyncio.gather(*(hot(client, "ECHO", f"v{i}") for i in range(300)))
            assert replies == [f"v{i}".encode() for i in range(300)]
            assert as_dict(await hot(client, "HGETALL", f"{prefix}:h")) == {b"a": b"1", b"b": b"2"}
            assert await hot(client, "HGETALL", f"{prefix}:missing") == []
        finally:
            await client.aclose()

    run(main())


def test_error_replies_raise_what_redis_py_raises(
    redis_url: str, prefix: str, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    async def main() -> None:
        client = connect(redis_url)
        try:
            with pytest.raises(NoScriptError):
                await hot(client, "EVALSHA", "0" * 40, 0)
            await client.set(f"{prefix}:s", "x")
            with pytest.raises(ResponseError, match="WRONGTYPE"):
                await hot(client, "HGETALL", f"{prefix}:s")
            assert await hot(client, "PING") == b"PONG"  # the connection is still in step
        finally:
            await client.aclose()

    run(main())


def test_a_cancelled_caller_does_not_shift_the_replies(
    redis_url: str, prefix: str, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    async def main() -> None:
        client = connect(redis_url)
        try:
            await hot(client, "PING")
            # BLPOP holds the lane's connection: the ECHO behind it is answered after it.
            slow = asyncio.ensure_future(hot(client, "BLPOP", f"{prefix}:never", "0.3"))
            behind = asyncio.ensure_future(hot(client, "ECHO", "behind"))
            await asyncio.sleep(0.05)
            slow.cancel()
            assert await behind == b"behind"
            assert await hot(client, "ECHO", "next") == b"next"
        finally:
            await client.aclose()

    run(main())


def test_a_killed_connection_is_replaced(
    redis_url: str, prefix: str, run: Callable[[Coroutine[Any, Any, None]], None]
) -> None:
    async def main() -> None:
        client = connect(redis_url)
        try:
            lane_id = await hot(client, "CLIENT", "ID")
            assert await client.client_kill_filter(_id=lane_id) == 1
            # Whether the loss is seen before or during the next command, the caller gets its reply.
            assert await hot(client, "ECHO", "after") == b"after"
            await asyncio.sleep(0.05)
            assert await hot(client, "CLIENT", "ID") != lane_id
        finally:
            await client.aclose()

    run(main())


def test_an_unreachable_redis_is_a_connection_error(run: Callable[[Coroutine[Any, Any, None]], None]) -> None:
    async def main() -> None:
        client = connect("redis://127.0.0.1:1/0")  # nothing listens on port 1
        try:
            with pytest.raises(RedisConnectionError):
                await hot(client, "PING")
        finally:
            await client.aclose()

    run(main())
