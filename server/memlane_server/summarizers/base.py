"""The summarizer protocol: incremental, budgeted, with token accounting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..sessions.model import Message


@dataclass(frozen=True, slots=True)
class SummaryResult:
    """A new rolling summary and what producing it cost.

    ``tokens_in``/``tokens_out`` are what the provider billed (an LLM's ``usage``) or, for offline
    providers, the tokens read and written; they feed the summarization metrics.
    """

    text: str
    token_count: int  # tokens of ``text`` in the summarizer's encoding; always <= the budget asked for
    tokens_in: int
    tokens_out: int
    provider: str


@runtime_checkable
class Summarizer(Protocol):
    """new summary = f(previous summary, turns leaving the window).

    Implementations never see turns older than ``leaving``: the previous summary stands for them. That
    keeps cost proportional to the turns leaving, not to the session's length.
    """

    @property
    def provider(self) -> str:
        """A short provider name for metrics and stats (``extractive``, ``openai``, ``client``)."""
        ...

    async def summarize(self, previous: str, leaving: list[Message], budget_tokens: int) -> SummaryResult:
        """Fold ``leaving`` (oldest first) into ``previous``; the result fits in ``budget_tokens``."""
        ...
