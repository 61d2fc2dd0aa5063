"""The Redis connection factory: one pool per process, built by the composition root.

``redis://`` / ``rediss://`` / ``unix://`` URLs give a single-node client; ``redis+cluster://host:port``
(or ``rediss+cluster://``) gives a :class:`redis.asyncio.RedisCluster` seeded from that node. The cluster
client exposes the same command methods memlane uses (every multi-key script and MULTI touches one
session's hash tag, so one slot), so the rest of the code takes it as an ``aioredis.Redis``; the few places
that must act per node (keyspace events, SCAN, CONFIG) ask :func:`is_cluster`.

**Timing** (``time_commands``): every Redis round trip is timed by command family
(``memlane_backend_latency_seconds{backend="redis"}``) and told, with its command, to the sidecar's
tracing (``trace``: inside a traced call, a CLIENT span named for the command).

The client's own ``execute_command`` and ``pipeline`` are wrapped on the instance (the same code works for
a single node and for :class:`redis.asyncio.RedisCluster`): one command is one round trip, a pipeline or
MULTI/EXEC is one round trip when it executes. Labels come from a fixed table, never from arguments, so the
series stay bounded. Cost measured: ~2 us per call (two clocks and one observe on a cached child) against
~180 us for the cheapest HGET round trip on loopback, about 1 %.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ClusterDownError, NoScriptError, RedisError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..errors import MemlaneError, ResourceExhausted, Unavailable
from .redis_lane import attach, is_normal_error_reply, lane_of

# Raised by the client when Redis cannot be reached (or a cluster shard has no master during a
# failover); the API maps them to UNAVAILABLE.
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ConnectionError,
    ClusterDownError,
    TryAgainError,
)

# How long a caller should wait before retrying: a Redis restarting (an embedded one comes back in about a
# second, a failover in 2-5 s), a full disk (an operator has to free space).
UNAVAILABLE_RETRY_MS = 1000
STORAGE_FULL_RETRY_MS = 5000


def storage_full() -> ResourceExhausted:
    """A Redis that could not write its append-only file (a full disk)."""
    return ResourceExhausted(
        # The call that met the full disk may have been taken in memory (redis_server.EmbeddedRedis.
        # confirm_written): kept if space returns before a restart, so a retry must reuse its ids.
        "Redis cannot store writes: it could not write to its disk (full?); nothing of this call is on"
        " disk: retry it with the same ids once space is freed",
        reason="STORAGE_FULL",
        retry_after_ms=STORAGE_FULL_RETRY_MS,
    )


def backend_fault(exc: BaseException) -> MemlaneError | None:
    """What a Redis failure means to the caller, or None when it is not Redis's fault: ``Unavailable``
    for a Redis not reachable (or still loading its data), ``ResourceExhausted`` for one refusing writes
    for want of room (MISCONF: it cannot write its append-only file or snapshot, a full disk; OOM: its
    maxmemory), both with a retry hint. Never INTERNAL: nothing is wrong with the request."""
    if isinstance(exc, UNAVAILABLE_ERRORS):
        return Unavailable(
            "a backing store (Redis) is unavailable; retry shortly",
            reason="BACKEND_UNAVAILABLE",
            retry_after_ms=UNAVAILABLE_RETRY_MS,
        )
    if isinstance(exc, ResponseError):
        text = str(exc)
        if "MISCONF" in text:  # also inside a script's error ("... script: ...")
            return storage_full()
        if text.startswith("OOM ") or "OOM command not allowed" in text:
            return ResourceExhausted(
                "Redis is at its memory limit (maxmemory); nothing was stored, retry once memory is freed",
                reason="STORAGE_FULL",
                retry_after_ms=STORAGE_FULL_RETRY_MS,
            )
    return None


# The client's type, for the wiring that hands it to the stores without importing redis itself (only
# the storage layer may; tests/unit/test_storage_ownership.py).
RedisClient: TypeAlias = aioredis.Redis

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def cluster_seed(url: str) -> str | None:
    """The plain ``redis://`` seed URL when ``url`` names a cluster, else None."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme in CLUSTER_SCHEMES:
        return f"{CLUSTER_SCHEMES[scheme]}://{rest}"
    return None


# uvloop's wording (UVHandle._ensure_alive) for an operation on a transport that is closed already.
_CLOSED_HANDLE = "the handler is closed"


class _CancelSafeWrites:
    """Writes a command under ``asyncio.timeout`` instead of redis-py's ``asyncio.wait_for``, and makes a
    write on a transport uvloop has closed a ``ConnectionError``.

    Before Python 3.12, ``wait_for`` swallows a cancellation that lands while the write it wraps has just
    completed (CPython gh-86296): the cancelled task carries on with the next command. A background loop
    (the session-end worker's periodic jobs, a WatchSessionEvents stream's XREAD loop) cancelled at that
    instant never ends, and ``Sidecar.stop()`` waited for it forever; on Redis Cluster the window is hit
    often (measured: 1 cancel in ~40 of an XREAD BLOCK loop, on every test module's shutdown).
    """

    socket_timeout: float | None

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        try:
            await self._send_bounded(command, check_health)
        except RuntimeError as exc:
            # uvloop refuses a write on a transport the peer already reset (a killed cluster master) with
            # RuntimeError, where the stdlib loop's drain raises ConnectionResetError. Made a
            # ConnectionError, redis-py reconnects and retries (the cluster client re-reads the slot map)
            # and the API answers UNAVAILABLE; the base class has disconnected the connection already.
            if _CLOSED_HANDLE not in str(exc):
                raise
            raise RedisConnectionError(f"Error while writing to socket. {exc}.") from exc

    async def _send_bounded(self, command: Any, check_health: bool) -> None:
        limit = self.socket_timeout
        conn = cast(AbstractConnection, self)
        if not limit or sys.version_info >= (3, 12):
            return await AbstractConnection.send_packed_command(conn, command, check_health)
        self.socket_timeout = None  # the base class then writes without wait_for; reads are bounded below
        try:
            async with asyncio.timeout(limit):
                await AbstractConnection.send_packed_command(conn, command, check_health)
        except TimeoutError:  # the builtin: our deadline passed (redis-py's own is a RedisError)
            await conn.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        finally:
            self.socket_timeout = limit


class _SafeConnection(_CancelSafeWrites, Connection):
    pass


class _SafeSSLConnection(_CancelSafeWrites, SSLConnection):
    pass


class _SafeUnixConnection(_CancelSafeWrites, UnixDomainSocketConnection):
    pass


_SAFE: dict[type[AbstractConnection], type[AbstractConnection]] = {
    Connection: _SafeConnection,
    SSLConnection: _SafeSSLConnection,
    UnixDomainSocketConnection: _SafeUnixConnection,
}


def _safe(cls: type[AbstractConnection]) -> type[AbstractConnection]:
    return _SAFE.get(cls, cls)


def is_cluster(redis: aioredis.Redis) -> bool:
    return isinstance(redis, RedisCluster)


async def unanswered(url: str, timeout_s: float) -> str | None:
    """Why ``url`` does not answer a PING within ``timeout_s`` (a malformed URL, a refused connection,
    ...), or None when it does. One short-lived connection, before any pool exists (start-up checks); a
    cluster is asked through its seed node."""
    try:
        client = aioredis.Redis.from_url(
            cluster_seed(url) or url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
        )
    except ValueError as exc:
        return str(exc)
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        return str(exc)
    finally:
        await client.aclose()
    return None


def connect(url: str, *, max_connections: int = 64) -> aioredis.Redis:
    """A pooled client that rides out a short Redis restart (or a cluster failover, about 2-5 s with a
    2 s node timeout): reconnects with backoff before the caller sees UNAVAILABLE. Every write we retry
    is idempotent (message ids)."""
    seed = cluster_seed(url)
    if seed is not None:
        cluster = RedisCluster.from_url(
            seed,
            max_connections=max_connections,
            socket_connect_timeout=2.0,
            socket_timeout=5.0,
            # A killed master answers nothing until its replica is promoted (node timeout + election):
            # keep retrying, re-reading the slot map each time, for about 6 s.
            retry=Retry(ExponentialBackoff(cap=1.0, base=0.1), retries=10),
            decode_responses=False,
        )
        # RedisCluster takes no connection class: swap it where nodes are made (the kwargs every later
        # node is built from, and the seed nodes already built).
        safe = _safe(cluster.connection_kwargs["connection_class"])
        cluster.connection_kwargs["connection_class"] = safe
        cluster.nodes_manager.connection_kwargs["connection_class"] = safe
        for node in cluster.nodes_manager.startup_nodes.values():
            node.connection_class = cast(type[Connection], _safe(node.connection_class))
        # Same command surface for every call memlane makes; see the module docstring.
        return cast(aioredis.Redis, cluster)
    client = aioredis.Redis.from_url(
        url,
        max_connections=max_connections,
        socket_connect_timeout=2.0,
        socket_timeout=5.0,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=5),
        retry_on_error=[RedisConnectionError, RedisTimeoutError, ConnectionError],
        decode_responses=False,
    )
    pool = client.connection_pool
    pool.connection_class = _safe(pool.connection_class)
    attach(client)  # the hot path's single commands go through a pipelined lane (redis_lane.py)
    return client


# Timing: every round trip by command family.

# Command -> family; anything else is "other". Families follow Redis's own command groups.
_GROUPS = {
    "string": "GET SET MGET MSET SETNX SETEX PSETEX GETDEL GETEX INCR INCRBY DECR DECRBY APPEND STRLEN",
    "hash": "HGET HSET HMGET HMSET HDEL HGETALL HINCRBY HEXISTS HLEN HKEYS HVALS HSCAN HSETNX",
    "list": "LPUSH RPUSH LPOP RPOP LRANGE LLEN LTRIM LREM LINDEX LMOVE",
    # Waiting for data is not latency: kept apart so it does not swamp the p99 of the others.
    "blocking": "BLPOP BRPOP BLMOVE BZPOPMIN BZPOPMAX",
    "set": "SADD SREM SMEMBERS SISMEMBER SMISMEMBER SCARD SSCAN",
    "zset": "ZADD ZREM ZRANGE ZREVRANGE ZRANGEBYSCORE ZREVRANGEBYSCORE ZSCORE ZMSCORE ZCARD ZCOUNT "
    "ZREMRANGEBYRANK ZREMRANGEBYSCORE ZPOPMIN ZPOPMAX ZINCRBY ZRANK ZSCAN",
    "stream": "XADD XREAD XREADGROUP XACK XCLAIM XAUTOCLAIM XPENDING XGROUP XLEN XRANGE XDEL XTRIM XINFO",
    "key": "DEL UNLINK EXISTS EXPIRE PEXPIRE EXPIREAT PEXPIREAT TTL PTTL PERSIST TYPE SCAN RENAME",
    "script": "EVAL EVALSHA EVAL_RO EVALSHA_RO SCRIPT FCALL FUNCTION",
    "server": "PING INFO CONFIG WAIT DBSIZE TIME CLIENT CLUSTER MEMORY",
    "pubsub": "PUBLISH SUBSCRIBE PSUBSCRIBE UNSUBSCRIBE PUNSUBSCRIBE",
}
FAMILY = {cmd: family for family, cmds in _GROUPS.items() for cmd in cmds.split()}
FAMILIES = (*_GROUPS, "pipeline", "other")

Observe = Callable[[str, float, bool], None]  # (family, seconds, failed)


def family_of(command: object, *args: object) -> str:
    name = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
    family = FAMILY.get(name.split(" ", 1)[0].upper(), "other")
    if family == "stream" and ("BLOCK" in args or b"BLOCK" in args):  # XREAD ... BLOCK ms (events.py)
        return "blocking"
    return family


def is_failure(exc: BaseException) -> bool:
    """A fault of the backend or the call, not a normal reply that redis-py raises (NOSCRIPT, which it
    answers by loading the script; BUSYGROUP, the group exists)."""
    if isinstance(exc, NoScriptError):
        return False
    return not (isinstance(exc, ResponseError) and is_normal_error_reply(str(exc)))


# Told of each round trip with the command itself, after its reply (the sidecar's tracing records a span).
Trace = Callable[[tuple[Any, ...], float, bool], None]  # (command, seconds, failed)
_PIPELINE = ("PIPELINE",)


def _lane_done(
    observe: Observe, trace: Trace | None, command: tuple[Any, ...], seconds: float, failed: bool
) -> None:
    """A lane's command, reported as the pooled client's are."""
    observe(family_of(*command), seconds, failed)
    if trace is not None:
        trace(command, seconds, failed)


def time_commands(client: aioredis.Redis, observe: Observe, trace: Trace | None = None) -> None:
    """Wraps ``client`` in place so every command and pipeline execution reports to ``observe`` (and, with
    its command, to ``trace``)."""
    execute_command: Callable[..., Awaitable[Any]] = client.execute_command
    make_pipeline: Callable[..., Any] = client.pipeline

    async def timed_command(*args: Any, **options: Any) -> Any:
        start = time.perf_counter()
        failed = False
        try:
            return await execute_command(*args, **options)
        except BaseException as exc:
            failed = is_failure(exc)
            raise
        finally:
            seconds = time.perf_counter() - start
            observe(family_of(*args) if args else "other", seconds, failed)
            if trace is not None:
                trace(args, seconds, failed)

    def timed_pipeline(*args: Any, **kwargs: Any) -> Any:
        pipe = make_pipeline(*args, **kwargs)
        execute: Callable[..., Awaitable[Any]] = pipe.execute

        async def timed_execute(*a: Any, **kw: Any) -> Any:
            start = time.perf_counter()
            failed = False
            try:
                return await execute(*a, **kw)
            except BaseException as exc:
                failed = is_failure(exc)
                raise
            finally:
                seconds = time.perf_counter() - start
                observe("pipeline", seconds, failed)
                if trace is not None:
                    trace(_PIPELINE, seconds, failed)

        pipe.execute = timed_execute
        return pipe

    client.execute_command = timed_command  # type: ignore[method-assign]
    client.pipeline = timed_pipeline  # type: ignore[method-assign]
    lane = lane_of(client)
    if lane is not None:  # the lane's commands are round trips like any other
        lane.observe = functools.partial(_lane_done, observe, trace)
