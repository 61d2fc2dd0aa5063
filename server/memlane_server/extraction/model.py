"""What extraction produces, and the ``Extractor`` protocol providers implement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..sessions.model import Message, Session

# The string values of ``ltm.MemoryKind``; extraction does not import ltm (imports point one way), and
# ``ExtractedMemory`` satisfies ``ltm.MemoryDraft`` structurally.
KIND_FACT = "fact"
KIND_PREFERENCE = "preference"
KIND_EPISODIC = "episodic"
KIND_INSTRUCTION = "instruction"
KINDS = (KIND_FACT, KIND_PREFERENCE, KIND_EPISODIC, KIND_INSTRUCTION)


@dataclass(slots=True)
class ExtractedMemory:
    kind: str
    content: str
    keywords: list[str] = field(default_factory=list)
    # Single-valued attribute ("location", "units", "name"): a later value supersedes an earlier one.
    slot: str = ""
    importance: float = 0.5
    source_message_ids: list[str] = field(default_factory=list)
    occurred_at_ms: int = 0
    # Whose it is ("subject": a participant's name, absent for the user) and when a relative time
    # it names falls ("resolved_time"); stored with the item (see ltm/ingest.py for the keys).
    metadata: dict[str, str] = field(default_factory=dict)


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
