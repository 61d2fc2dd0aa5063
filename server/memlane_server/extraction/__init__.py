"""Memory extraction: from a session's messages to candidate long-term memories.

Public face:

- ``Extractor`` protocol: ``async extract(messages, session) -> ExtractionResult`` (facts, preferences,
  instructions; never episodes). ``RulesExtractor`` (offline default), ``OpenAIExtractor``.
- ``build_episodes(messages, session)``: episodic items, one per exchange.
- ``find_pii`` / ``redact``: the PII guard every provider's output passes through.
- ``ExtractionMetrics`` / ``MeteredExtractor``: Prometheus metrics, tokens included.

``ExtractedMemory`` satisfies ``ltm.MemoryDraft``: hand the lists to ``MemoryService.ingest`` as is.
"""

from memlane_server.extraction.episodes import build_episodes
from memlane_server.extraction.metrics import ExtractionMetrics, MeteredExtractor
from memlane_server.extraction.model import ExtractedMemory, ExtractionResult, Extractor
from memlane_server.extraction.openai_compat import OpenAIExtractor, OpenAIExtractorSettings
from memlane_server.extraction.pii import find_pii, redact
from memlane_server.extraction.rules import RulesExtractor

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
