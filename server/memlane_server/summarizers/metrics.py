"""Summarization metrics, by provider, and a wrapper that records them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from ..observability.metrics import ModelUsageMetrics
from ..sessions.model import Message
from .base import Summarizer, SummaryResult


class SummarizationMetrics(ModelUsageMetrics):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry, "summarization")


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
        result = await self._metrics.timed(provider, self._inner.summarize(previous, leaving, budget_tokens))
        self._metrics.tokens(provider, result.tokens_in, result.tokens_out)
        return result
