"""Memory extraction: from a session's messages to candidate long-term memories.

Public face:

- ``Extractor`` protocol: ``async extract(messages, session) -> ExtractionResult`` (facts, preferences,
  instructions; never episodes). ``RulesExtractor`` (offline default), ``OpenAIExtractor``.
- ``build_episodes(messages, session)``: episodic items, one per exchange.
- ``find_pii`` / ``redact``: the PII guard every provider's output passes through.
- ``ExtractionMetrics`` / ``MeteredExtractor``: Prometheus metrics, tokens included.

``ExtractedMemory`` satisfies ``ltm.MemoryDraft``: hand the lists to ``MemoryService.ingest`` as is.
"""

from .episodes import build_episodes
from .extractor import ExtractedMemory, ExtractionMetrics, ExtractionResult, Extractor, MeteredExtractor
from .openai_compat import OpenAIExtractor, OpenAIExtractorSettings
from .pii import find_pii, redact
from .rules import RulesExtractor

__all__ = [
    "ExtractedMemory",
    "ExtractionMetrics",
    "ExtractionResult",
    "Extractor",
    "MeteredExtractor",
    "OpenAIExtractor",
    "OpenAIExtractorSettings",
    "RulesExtractor",
    "build_episodes",
    "find_pii",
    "redact",
]
