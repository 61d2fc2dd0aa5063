"""Extraction metrics, by provider (token usage is its own metric: the LLM bill), and a wrapper."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from ..observability.metrics import ModelUsageMetrics
from ..sessions.model import Message, Session
from .model import ExtractionResult, Extractor


class ExtractionMetrics(ModelUsageMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry, "extraction")
        self.memories = Counter(
            "memlane_extraction_memories",
            "Candidate memories by fate (kept, rejected_pii, rejected_picky).",
            ["provider", "fate"],
            registry=registry,
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
        m = self._metrics
        result = await m.timed(provider, self._inner.extract(messages, session))
        m.tokens(provider, result.tokens_in, result.tokens_out)
        m.memories.labels(provider, "kept").inc(len(result.memories))
        m.memories.labels(provider, "rejected_pii").inc(result.rejected_pii)
        m.memories.labels(provider, "rejected_picky").inc(result.rejected_picky)
        return result
