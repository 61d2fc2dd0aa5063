"""The Redis connection factory: one pool per process, built by the composition root.

``redis://`` / ``rediss://`` / ``unix://`` URLs give a single-node client; ``redis+cluster://host:port``
(or ``rediss+cluster://``) gives a :class:`redis.asyncio.RedisCluster` seeded from that node. The cluster
client exposes the same command methods memlane uses (every multi-key script and MULTI touches one
session's hash tag, so one slot), so the rest of the code takes it as an ``aioredis.Redis``; the few places
that must act per node (keyspace events, SCAN, CONFIG) ask :func:`is_cluster`.
"""

from __future__ import annotations

from typing import cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ClusterDownError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Raised by the client when Redis cannot be reached (or a cluster shard has no master during a
# failover); the API maps them to UNAVAILABLE.
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ConnectionError,
    ClusterDownError,
    TryAgainError,
)

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def cluster_seed(url: str) -> str | None:
    """The plain ``redis://`` seed URL when ``url`` names a cluster, else None."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme in CLUSTER_SCHEMES:
        return f"{CLUSTER_SCHEMES[scheme]}://{rest}"
    return None


def is_cluster(redis: aioredis.Redis) -> bool:
    return isinstance(redis, RedisCluster)


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
        # Same command surface for every call memlane makes; see the module docstring.
        return cast(aioredis.Redis, cluster)
    return aioredis.Redis.from_url(
        url,
        max_connections=max_connections,
        socket_connect_timeout=2.0,
        socket_timeout=5.0,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=5),
        retry_on_error=[RedisConnectionError, RedisTimeoutError, ConnectionError],
        decode_responses=False,
    )
