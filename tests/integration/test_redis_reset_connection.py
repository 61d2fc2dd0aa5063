"""A Redis connection reset under the sidecar is a retryable connection error, with uvloop too.

A cluster master killed during a failover resets the connections to it. With uvloop (what ``memlane
serve`` runs on), the next write on such a pooled connection raised ``RuntimeError: ... the handler is
closed`` (uvloop's transport), which redis-py neither retries nor counts as a ConnectionError, so
CreateSession answered INTERNAL instead of riding out the failover. The pool of ``infra/redis_pool.py``
turns it into a ``ConnectionError``: redis-py reconnects and retries, and the API maps it to UNAVAILABLE.

The reset comes from a TCP relay in front of a private real Redis that aborts its client sides with
SO_LINGER 0 (an RST, as from a dead host), so the instant does not hang on a process being killed.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis.asyncio as aioredis
import uvloop
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

import memlane
from memlane_server.background import SidecarThread
from memlane_server.config import Settings, build_settings
from memlane_server.infra.redis_pool import connect
from memlane_server.infra.redis_server import EmbeddedRedis

T = TypeVar("T")


class _Relay:
    """Relays TCP connections to a Redis Unix socket on a loop of its own; :meth:`reset` sends an RST on
    every client side relayed so far. ``accepted`` counts the connections made to it."""

    def __init__(self, upstream: str) -> None:
        self._upstream = upstream
        self._clients: list[asyncio.StreamWriter] = []
        self.accepted = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="relay", daemon=True)

    def start(self) -> str:
        self._thread.start()
        server = self._call(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self._server = server
        return f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}"

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        up_reader, up_writer = await asyncio.open_unix_connection(self._upstream)
        self._clients.append(writer)
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except (ConnectionError, RuntimeError):
            pass  # one side was reset: this connection's relaying is over
        finally:
            dst.close()

    async def _reset(self) -> int:
        clients, self._clients = self._clients, []
        live = [w for w in clients if not w.transport.is_closing()]  # a client that left needs no reset
        for writer in live:
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        return len(live)

    def reset(self) -> int:
        return self._call(self._reset())

    async def _shutdown(self) -> None:
        self._server.close()
        for writer in self._clients:
            writer.transport.abort()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._server.wait_closed()

    def stop(self) -> None:
        """Ends every relayed connection and the loop, leaving no coroutine behind to a closed loop."""
        if self._thread.is_alive():
            self._call(self._shutdown())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()


@pytest.fixture()
def relay(tmp_path: Path) -> Iterator[_Relay]:
    """A relay to a private Redis (a single node whatever MEMLANE_TEST_REDIS_URL says: the relay speaks to
    one node, and no other test's connections are touched)."""
    redis = EmbeddedRedis(tmp_path / "redis", persist=False, fsync=Settings().redis.embedded_redis_fsync)
    redis.start()
    relay = _Relay(str(redis.socket))
    try:
        yield relay
    finally:
        relay.stop()
        redis.stop()


async def _ping_after_reset(relay: _Relay, url: str, pool: str) -> object:
    """PINGs through the relay once its connections were reset under the pool; what the PING gave."""
    if pool == "memlane":
        client = connect(url)
    else:  # redis-py's own connection class with the same retries: the positive control
        client = aioredis.Redis.from_url(url, retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=5))
    try:
        assert await client.ping()
        assert relay.reset() == 1
        await asyncio.sleep(0.2)  # the RST reaches this loop, which closes the transport
        try:
            return await client.ping()
        except Exception as exc:  # what the caller saw is the result
            return exc
    finally:
        await client.aclose()


def test_a_reset_connection_is_retried_under_uvloop(relay: _Relay) -> None:
    url = relay.start()
    # Positive control: with redis-py's connection class uvloop's RuntimeError reaches the caller.
    plain = uvloop.run(_ping_after_reset(relay, url, "redis-py"))
    assert isinstance(plain, RuntimeError) and "handler is closed" in str(plain)
    # memlane's pool makes it a ConnectionError: redis-py reconnects and the retried PING answers.
    assert uvloop.run(_ping_after_reset(relay, url, "memlane")) is True


def test_create_session_rides_out_a_reset_on_a_uvloop_sidecar(relay: _Relay, tmp_path: Path) -> None:
    settings = build_settings(
        flags={
            "listen": "127.0.0.1:0",
            "admin_listen": "",
            "redis_url": relay.start(),
            "key_prefix": f"t{uuid.uuid4().hex[:10]}",
            "data_dir": str(tmp_path / "data"),
            "shutdown_grace_seconds": 1.0,
        },
        env={},
    )
    with (
        SidecarThread(settings, loop_factory=uvloop.new_event_loop) as server,
        memlane.Client(server.target, timeout=20) as c,
    ):
        for _ in range(3):  # leaves idle connections in the pool, the ones a failover resets
            c.create_session(user_id="u-reset")
        before = relay.accepted
        assert relay.reset() >= 1
        # Before the fix: INTERNAL (the RuntimeError). Now the pool reconnects and the call answers.
        for _ in range(3):
            assert c.create_session(user_id="u-reset").session.session_id
        assert relay.accepted > before  # the calls did go through new connections: the reset was hit
