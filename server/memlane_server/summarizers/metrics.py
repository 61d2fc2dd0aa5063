"""Prometheus metrics for summarization, by provider, and a wrapper that records them."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram

from memlane_server.sessions.model import Message

from .base import Summarizer, SummaryResult


class SummarizationMetrics:
    """Registered on the registry passed in (the app's), never on the process-global default."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.tokens_in = Counter(
            "memlane_summarization_tokens_in",
            "Tokens read by summarization (provider-billed for LLMs).",
            ["provider"],
            registry=registry,
        )
        self.tokens_out = Counter(
            "memlane_summarization_tokens_out",
            "Tokens written by summarization (provider-billed for LLMs).",
            ["provider"],
            registry=registry,
        )
        self.calls = Counter(
            "memlane_summarization_calls",
            "Summarization calls by outcome.",
            ["provider", "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            "memlane_summarization_latency_seconds",
            "Summarization latency.",
            ["provider"],
            registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )


class MeteredSummarizer:
    """A ``Summarizer`` that records calls, tokens and latency of the one it wraps."""

    def __init__(self, inner: Summarizer, metrics: SummarizationMetrics) -> None:
        self._inner = inner
        self._metrics = metrics

    @property
    def provider(self) -> str:
        return self._inner.provider

    async def summarize(self, previous: str, leaving: list[Message], budget_tokens: int) -> SummaryResult:
        provider = self._inner.provider
        start = time.perf_counter()
        try:
            result = await self._inner.summarize(previous, leaving, budget_tokens)
        except BaseException:
            self._metrics.calls.labels(provider, "error").inc()
            raise
        finally:
            self._metrics.latency.labels(provider).observe(time.perf_counter() - start)
        self._metrics.calls.labels(provider, "ok").inc()
        self._metrics.tokens_in.labels(provider).inc(result.tokens_in)
        self._metrics.tokens_out.labels(provider).inc(result.tokens_out)
        return result
