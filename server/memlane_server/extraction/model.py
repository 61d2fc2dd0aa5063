"""What extraction produces, and the ``Extractor`` protocol providers implement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..memory_kinds import MemoryDraft
from ..sessions.model import Message, Session

# A stated memory is the shared draft (``memory_kinds``): ltm's ``NewMemory`` builds on the same class,
# so ingestion takes extraction's output as is and a field is declared once.
ExtractedMemory = MemoryDraft


@dataclass(slots=True)
class ExtractionResult:
    memories: list[ExtractedMemory] = field(default_factory=list)
    tokens_in: int = 0  # provider-billed tokens (0 for the offline rules)
    tokens_out: int = 0
    rejected_pii: int = 0  # candidates dropped by the PII guard
    rejected_picky: int = 0  # candidates dropped as greetings, acks, questions, restatements


class Extractor(Protocol):
    """Turns a session's messages into durable memories (never episodes: see ``episodes.py``)."""

    @property
    def provider(self) -> str: ...

    async def extract(self, messages: list[Message], session: Session) -> ExtractionResult: ...
