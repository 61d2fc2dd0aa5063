"""Summarizer providers behind one protocol: ``extractive`` (offline default) and ``openai``.

The ``client`` provider (the agent summarizes with its own model) needs no class here: assembly reports
the range to summarize and ``SubmitSummary`` stores the result (see ``memlane_server.context``).
"""

from .extractive import ExtractiveSummarizer
from .openai_compat import OpenAISettings, OpenAISummarizer
from .summarizer import MeteredSummarizer, SummarizationMetrics, Summarizer, SummaryResult

__all__ = [
    "ExtractiveSummarizer",
    "MeteredSummarizer",
    "OpenAISettings",
    "OpenAISummarizer",
    "SummarizationMetrics",
    "Summarizer",
    "SummaryResult",
]
