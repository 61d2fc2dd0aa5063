"""Metrics for work done by a model provider (summarization, extraction): calls by outcome, tokens
read and written (what an LLM provider bills) and latency, each by provider."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram

T = TypeVar("T")

_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ModelUsageMetrics:
    """Registered on the registry passed in (the app's), never on the process-global default."""

    def __init__(self, registry: CollectorRegistry, work: str) -> None:
        self.tokens_in = Counter(
            f"memlane_{work}_tokens_in",
            f"Tokens read by {work} (provider-billed for LLMs).",
            ["provider"],
            registry=registry,
        )
        self.tokens_out = Counter(
            f"memlane_{work}_tokens_out",
            f"Tokens written by {work} (provider-billed for LLMs).",
            ["provider"],
            registry=registry,
        )
        self.calls = Counter(
            f"memlane_{work}_calls",
            f"{work.capitalize()} calls by outcome.",
            ["provider", "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            f"memlane_{work}_latency_seconds",
            f"{work.capitalize()} latency.",
            ["provider"],
            registry=registry,
            buckets=_BUCKETS,
        )

    async def timed(self, provider: str, call: Awaitable[T]) -> T:
        """Awaits ``call``, counting it as ok or error and observing its latency."""
        start = time.perf_counter()
        try:
            result = await call
        except BaseException:
            self.calls.labels(provider, "error").inc()
            raise
        finally:
            self.latency.labels(provider).observe(time.perf_counter() - start)
        self.calls.labels(provider, "ok").inc()
        return result

    def tokens(self, provider: str, tokens_in: int, tokens_out: int) -> None:
        self.tokens_in.labels(provider).inc(tokens_in)
        self.tokens_out.labels(provider).inc(tokens_out)
