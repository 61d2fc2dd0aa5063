"""Prometheus metrics for extraction, by provider: token usage is its own metric (the LLM bill)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram

from memlane_server.extraction.model import ExtractionResult, Extractor
from memlane_server.sessions.model import Message, Session


class ExtractionMetrics:
    """Registered on the registry passed in (the app's), never on the process-global default."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.tokens = Counter(
            "memlane_extraction_tokens",
            "Tokens used by memory extraction (provider-billed for LLMs), by direction.",
            ["provider", "direction"],
            registry=registry,
        )
        self.calls = Counter(
            "memlane_extraction_calls",
            "Extraction calls by outcome.",
            ["provider", "outcome"],
            registry=registry,
        )
        self.memories = Counter(
            "memlane_extraction_memories",
            "Candidate memories by fate (kept, rejected_pii, rejected_picky).",
            ["provider", "fate"],
            registry=registry,
        )
        self.latency = Histogram(
            "memlane_extraction_latency_seconds",
            "Extraction latency.",
            ["provider"],
            registry=registry,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )


class MeteredExtractor:
    """An ``Extractor`` that records calls, tokens, fates and latency of the one it wraps."""

    def __init__(self, inner: Extractor, metrics: ExtractionMetrics) -> None:
        self._inner = inner
        self._metrics = metrics

    @property
    def provider(self) -> str:
        return self._inner.provider

    async def extract(self, messages: list[Message], session: Session) -> ExtractionResult:
        provider = self._inner.provider
        start = time.perf_counter()
        try:
            result = await self._inner.extract(messages, session)
        except BaseException:
            self._metrics.calls.labels(provider, "error").inc()
            raise
        finally:
            self._metrics.latency.labels(provider).observe(time.perf_counter() - start)
        m = self._metrics
        m.calls.labels(provider, "ok").inc()
        m.tokens.labels(provider, "in").inc(result.tokens_in)
        m.tokens.labels(provider, "out").inc(result.tokens_out)
        m.memories.labels(provider, "kept").inc(len(result.memories))
        m.memories.labels(provider, "rejected_pii").inc(result.rejected_pii)
        m.memories.labels(provider, "rejected_picky").inc(result.rejected_picky)
        return result
