"""Retry policy: only idempotent calls (every call is, by client-side ids), exponential backoff with full
jitter. UNAVAILABLE is retried; so is RESOURCE_EXHAUSTED when the server shed the call under load and said
when to come back (``retry-after-ms`` trailer): the wait is then at least that hint. A RESOURCE_EXHAUSTED
without the hint is a quota or size limit and is final."""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 4
    initial_backoff: float = 0.05
    max_backoff: float = 1.0
    multiplier: float = 2.0
    retryable: frozenset[grpc.StatusCode] = frozenset({grpc.StatusCode.UNAVAILABLE})

    def backoff(self, attempt: int, hint_s: float = 0.0) -> float:
        """Sleep before retry number ``attempt`` (1-based)."""
        cap = min(self.max_backoff, self.initial_backoff * self.multiplier ** (attempt - 1))
        # With a server hint: the hint plus jitter, so shed callers do not all come back at once.
        return hint_s + random.uniform(0, cap) if hint_s > 0 else random.uniform(0, cap)


RETRY_AFTER_KEY = "retry-after-ms"


def retry_hint(exc: grpc.RpcError) -> float:
    """Seconds the server asked us to wait (``retry-after-ms`` trailer), 0 when it gave no hint."""
    try:
        trailers = exc.trailing_metadata() or ()
    except Exception:
        return 0.0
    for key, value in trailers:
        if key == RETRY_AFTER_KEY:
            try:
                return max(0.0, int(value) / 1000)
            except ValueError:
                return 0.0
    return 0.0


NO_RETRY = RetryPolicy(max_attempts=1)
