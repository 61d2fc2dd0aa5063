"""The configured providers: the memory extractor and the summarizer, each metered. An HTTP provider is
also returned bare, so the sidecar closes its client at shutdown."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from prometheus_client import CollectorRegistry

from ..config import ExtractionSettings, SummarizationSettings
from ..extraction import (
    ExtractionMetrics,
    Extractor,
    MeteredExtractor,
    OpenAIExtractor,
    OpenAIExtractorSettings,
    RulesExtractor,
)
from ..summarizers import (
    ExtractiveSummarizer,
    MeteredSummarizer,
    OpenAISettings,
    OpenAISummarizer,
    SummarizationMetrics,
    Summarizer,
)
from ..tokens import TokenCounter


def build_extractor(
    s: ExtractionSettings, registry: CollectorRegistry
) -> tuple[Extractor, OpenAIExtractor | None]:
    if s.extractor == "rules":
        return MeteredExtractor(RulesExtractor(), ExtractionMetrics(registry)), None
    http = OpenAIExtractor(
        OpenAIExtractorSettings(
            base_url=s.extractor_base_url,
            model=s.extractor_model,
            api_key=s.extractor_api_key,
            timeout_s=s.extractor_timeout_seconds,
        )
    )
    return MeteredExtractor(http, ExtractionMetrics(registry)), http


def build_summarizer(
    s: SummarizationSettings,
    tokens: TokenCounter,
    *,
    default_model: str,
    executor: ThreadPoolExecutor,
    registry: CollectorRegistry,
) -> tuple[Summarizer | None, OpenAISummarizer | None]:
    """None for ``client`` (the agent summarizes)."""
    if s.summarizer == "client":
        return None, None
    http: OpenAISummarizer | None = None
    summarizer: Summarizer
    if s.summarizer == "openai":
        summarizer = http = OpenAISummarizer(
            OpenAISettings(
                base_url=s.summarizer_base_url,
                model=s.summarizer_model,
                api_key=s.summarizer_api_key,
                timeout_s=s.summarizer_timeout_seconds,
            ),
            tokens,
        )
    else:
        summarizer = ExtractiveSummarizer(tokens, default_model, executor)
    return MeteredSummarizer(summarizer, SummarizationMetrics(registry)), http
