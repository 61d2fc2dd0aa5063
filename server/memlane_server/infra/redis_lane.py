"""A pipelined Redis connection for the hot path's single commands (an append, reading turns, a session
document), beside the pooled redis-py client.

Why: redis-py's asyncio client spends more Python per command than the round trip itself (pool
checkout and release, retry and timeout wrappers, its reader). Measured in a grpc.aio handler on this
machine kind: one PING through redis-py makes the call 1.35x a bare echo, the same PING through this
lane 1.14x. Every command goes out on one connection as it is issued and the replies are matched in
order (Redis answers a connection's commands in order), so concurrent callers share one socket and
its reads.

What it does not do, it hands back: a connection that cannot be made or is lost, or a reply later than
the socket timeout, raises redis-py's ``ConnectionError`` / ``TimeoutError`` and the caller resends
through the pooled client, which reconnects with backoff (``sessions.messages.SessionMessages._hot``).
Error replies become the exceptions redis-py raises for them. Only single-node ``redis://`` and
``unix://`` clients get a lane (``lane_of`` is None for TLS and Redis Cluster).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, cast

import hiredis
import redis.asyncio as aioredis
from redis._parsers.base import BaseParser
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

Observe = Callable[[tuple[Any, ...], float, bool], None]  # (command, seconds, failed)


# Error replies that are answers on a healthy server, not faults: NOSCRIPT (a script's first use since
# Redis started or flushed its cache; the caller loads it and retries) and BUSYGROUP (the consumer
# group exists already). They are not counted in memlane_backend_errors_total.
_NORMAL_ERROR_PREFIXES = ("NOSCRIPT", "BUSYGROUP")


def is_normal_error_reply(message: str) -> bool:
    return message.startswith(_NORMAL_ERROR_PREFIXES)


class _ErrorReply(Exception):
    """What the reader makes of an error reply; turned into redis-py's exception by the caller."""


def redis_error(reply: _ErrorReply) -> Exception:
    """The exception redis-py raises for this error reply (NoScriptError for NOSCRIPT...)."""
    parse: Callable[[str], Exception] = BaseParser.parse_error  # redis-py leaves it untyped
    return parse(str(reply))


def pack(args: tuple[Any, ...]) -> bytes:
    """One command in RESP, arguments encoded as redis-py encodes them (str UTF-8, numbers by repr)."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            b = a.encode()
        elif isinstance(a, bytes):
            b = a
        elif isinstance(a, bool):  # redis-py refuses booleans too
            raise TypeError("a boolean is not a Redis argument")
        elif isinstance(a, int | float):
            b = repr(a).encode()
        else:
            b = bytes(a)
        out += (b"$%d\r\n" % len(b), b, b"\r\n")
    return b"".join(out)


class _Wire(asyncio.Protocol):
    """One connection: commands written as issued, replies handed to the waiters in order."""

    def __init__(self) -> None:
        self._reader = hiredis.Reader(replyError=_ErrorReply)
        self.waiters: deque[tuple[asyncio.Future[Any], float]] = deque()
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._held: list[bytes] | None = None  # commands waiting for the end of this loop iteration

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass, only alike

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while (reply := self._reader.gets()) is not False:
            if not self.waiters:  # a reply nobody asked for: the stream is out of step
                self.fail(RedisConnectionError("Redis sent a reply nobody asked for"))
                return
            waiter, _ = self.waiters.popleft()
            if not waiter.done():  # a cancelled caller's reply is read and dropped
                waiter.set_result(reply)

    def write(self, command: bytes, loop: asyncio.AbstractEventLoop) -> None:
        """The first command of a loop iteration goes out at once; those issued after it in the same
        iteration (concurrent calls) go out together when it ends: one write, and one read for Redis."""
        if self._held is not None:
            self._held.append(command)
            return
        assert self.transport is not None
        self.transport.write(command)
        self._held = []
        loop.call_soon(self._release)

    def _release(self) -> None:
        held, self._held = self._held, None
        if held and not self.lost and self.transport is not None:
            self.transport.write(b"".join(held))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail_waiters(RedisConnectionError(f"Connection to Redis lost: {exc or 'closed'}"))

    def fail(self, exc: Exception) -> None:
        """Ends the connection and every command waiting on it with ``exc``."""
        self.lost = True
        self._fail_waiters(exc)
        if self.transport is not None:
            self.transport.abort()

    def _fail_waiters(self, exc: Exception) -> None:
        while self.waiters:
            waiter, _ = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(exc)


class RedisLane:
    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 6379,
        path: str = "",
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        timeout_s: float = 5.0,
        connect_timeout_s: float = 2.0,
    ) -> None:
        self._host, self._port, self._path = host, port, path
        # Run on each new connection, as redis-py does: AUTH (with the user when named), then SELECT.
        self._setup: list[tuple[Any, ...]] = []
        if password:
            self._setup.append(("AUTH", username, password) if username else ("AUTH", password))
        if db:
            self._setup.append(("SELECT", db))
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._wire: _Wire | None = None
        self._connecting: asyncio.Lock | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self.observe: Observe | None = None  # set by redis_pool.time_commands

    async def execute(self, *args: Any) -> Any:
        """One command's reply; redis-py's exception for an error reply or a lost connection."""
        wire = self._wire
        if wire is None or wire.lost:
            wire = await self._connect()
        start = time.perf_counter()
        failed = True
        try:
            reply = await self._send(wire, pack(args))
            failed = isinstance(reply, _ErrorReply) and not is_normal_error_reply(str(reply))
        finally:
            if self.observe is not None:
                self.observe(args, time.perf_counter() - start, failed)
        if isinstance(reply, _ErrorReply):
            raise redis_error(reply)
        return reply

    def _send(self, wire: _Wire, command: bytes) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()
        wire.waiters.append((waiter, loop.time()))
        wire.write(command, loop)
        if self._watchdog is None:
            self._watchdog = loop.call_later(self._timeout_s, self._check_late, wire)
        return waiter

    def _check_late(self, wire: _Wire) -> None:
        """Ends the connection when its oldest command has waited longer than the socket timeout (a
        Redis that stopped answering); otherwise looks again when that command would be late."""
        self._watchdog = None
        if wire.lost or not wire.waiters:
            return
        loop = asyncio.get_running_loop()
        due = wire.waiters[0][1] + self._timeout_s
        if loop.time() >= due:
            wire.fail(RedisTimeoutError("Timeout reading from Redis"))
            return
        self._watchdog = loop.call_at(due, self._check_late, wire)

    async def _connect(self) -> _Wire:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._wire is not None and not self._wire.lost:
                return self._wire  # another caller connected while this one waited
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(self._connect_timeout_s):
                    if self._path:
                        _, wire = await loop.create_unix_connection(_Wire, self._path)
                    else:
                        _, wire = await loop.create_connection(_Wire, self._host, self._port)
                    for command in self._setup:
                        reply = await self._send(wire, pack(command))
                        if isinstance(reply, _ErrorReply):
                            wire.fail(RedisConnectionError("Redis refused the lane's setup"))
                            raise redis_error(reply)
            except TimeoutError:
                raise RedisTimeoutError("Timeout connecting to Redis") from None
            except OSError as exc:
                raise RedisConnectionError(f"Error connecting to Redis: {exc}") from exc
            if self._watchdog is not None:  # it watched the lost connection; the next send starts one
                self._watchdog.cancel()
                self._watchdog = None
            self._wire = wire
            return wire

    async def aclose(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        wire, self._wire = self._wire, None
        if wire is not None and wire.transport is not None:
            wire.transport.close()
            wire.lost = True


_LANES: weakref.WeakKeyDictionary[aioredis.Redis, RedisLane] = weakref.WeakKeyDictionary()


def attach(client: aioredis.Redis) -> None:
    """Gives a single-node ``client`` a lane to the same server (same db and credentials), closed with it."""
    pool = client.connection_pool
    kw = pool.connection_kwargs
    kind = pool.connection_class
    auth: dict[str, Any] = {
        "db": int(kw.get("db") or 0),
        "username": kw.get("username"),
        "password": kw.get("password"),
        "timeout_s": kw.get("socket_timeout") or 5.0,
        "connect_timeout_s": kw.get("socket_connect_timeout") or 2.0,
    }
    if issubclass(kind, UnixDomainSocketConnection):
        lane = RedisLane(path=kw["path"], **auth)
    elif issubclass(kind, Connection) and not issubclass(kind, SSLConnection):
        lane = RedisLane(host=kw.get("host", "localhost"), port=int(kw.get("port", 6379)), **auth)
    else:
        return
    _LANES[client] = lane
    close = client.aclose

    async def aclose(*args: Any, **kwargs: Any) -> None:
        await lane.aclose()
        await close(*args, **kwargs)

    client.aclose = aclose  # type: ignore[method-assign]


def lane_of(client: aioredis.Redis) -> RedisLane | None:
    return _LANES.get(client)


async def hot(client: aioredis.Redis, *command: Any) -> Any:
    """One command of a hot path, its raw reply (HGETALL: a flat list from the lane, a dict from the
    pooled client): through ``client``'s lane when it has one. A lane that cannot reach Redis hands the
    command to the pooled client, which reconnects with backoff, so a restart is ridden out as before;
    the command may then run twice, as with redis-py's own retry, so only reads and writes made
    idempotent by their arguments (message ids, trace ids) come here."""
    lane = _LANES.get(client)
    if lane is not None:
        try:
            return await lane.execute(*command)
        except (RedisConnectionError, RedisTimeoutError):
            pass
    command_of: Callable[..., Awaitable[Any]] = client.execute_command  # redis-py leaves it untyped
    return await command_of(*command)


def as_dict(reply: Any) -> dict[Any, Any]:
    """An HGETALL reply of either client as a dict."""
    return reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2], strict=True))
