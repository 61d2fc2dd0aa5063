"""The Redis connection factory: one pool per process, built by the composition root."""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

# Raised by the client when Redis cannot be reached; the API maps them to UNAVAILABLE.
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ConnectionError,
)


def connect(url: str, *, max_connections: int = 64) -> aioredis.Redis:
    """A pooled client that rides out a short Redis restart: a few reconnects with backoff (about 1.5 s
    in all) before the caller sees UNAVAILABLE. Every write we retry is idempotent (message ids)."""
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
