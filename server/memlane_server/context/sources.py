"""What assembly needs from long-term memory, as a protocol; the app wires the LTM adapter in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class MemoryHit:
    memory_id: str
    text: str
    score: float = 0.0


class MemorySource(Protocol):
    """Profile facts and recalled memories for a user (and agent). Both may be slow (retrieval)."""

    async def profile(self, user_id: str, agent_id: str, limit_tokens: int) -> list[MemoryHit]:
        """The user's semantic profile, most important first, roughly within ``limit_tokens``."""
        ...

    async def recall(self, user_id: str, agent_id: str, query: str, limit: int) -> list[MemoryHit]:
        """Memories relevant to ``query``, best first."""
        ...


class NoMemory:
    """A ``MemorySource`` with nothing in it: assembly without long-term memory."""

    async def profile(self, user_id: str, agent_id: str, limit_tokens: int) -> list[MemoryHit]:
        return []

    async def recall(self, user_id: str, agent_id: str, query: str, limit: int) -> list[MemoryHit]:
        return []
