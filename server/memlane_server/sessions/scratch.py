"""Clean-up for commands that run a sidecar on a user's Redis for a while (``memlane eval``, ``memlane
bench``): every key they created lives under their own key prefix, and goes when they finish."""

from __future__ import annotations

import redis

from .keys import KeySpace


def drop_keys(redis_url: str, key_prefix: str, *, batch: int = 500) -> int:
    """Deletes every key under ``key_prefix`` (the layout of ``KeySpace``); returns how many. SCAN, not
    KEYS, so a big shared Redis is not blocked."""
    client = redis.Redis.from_url(redis_url)
    deleted = 0
    try:
        pending: list[bytes] = []
        for key in client.scan_iter(match=KeySpace(key_prefix).pattern(), count=1000):
            pending.append(key)
            if len(pending) >= batch:
                deleted += int(client.unlink(*pending))
                pending.clear()
        if pending:
            deleted += int(client.unlink(*pending))
    finally:
        client.close()
    return deleted
