"""What assembly needs from long-term memory, as a protocol; the app wires the LTM adapter in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ..access.identity import Caller
from ..ltm.model import ScoreParts


@dataclass(frozen=True, slots=True)
class MemoryHit:
    memory_id: str
    text: str
    score: float = 0.0
    parts: ScoreParts | None = None  # why a recalled memory ranked where it did; None for profile items


class MemorySource(Protocol):
    """Profile facts and recalled memories of one user, as ``viewer`` may see them (its own and its
    groups' items, never another agent's private ones). Both may be slow (retrieval)."""

    async def profile(self, user_id: str, viewer: Caller, limit_tokens: int) -> list[MemoryHit]:
        """The user's semantic profile, most important first, roughly within ``limit_tokens``."""
        ...

    async def recall(
        self, user_id: str, viewer: Caller, query: str, limit: int, channel: str = "", *, spares: int = 0
    ) -> list[MemoryHit]:
        """Memories relevant to ``query``, best first; ``channel`` is where the conversation happens.
        Up to ``limit + spares``: the spares stand in for hits assembly already shows elsewhere."""
        ...

    def forget(self, user_id: str) -> None:
        """Drop anything cached about the user (erasure)."""
        ...


class NoMemory:
    """A ``MemorySource`` with nothing in it: assembly without long-term memory."""

    def forget(self, user_id: str) -> None:
        return None

    async def profile(self, user_id: str, viewer: Caller, limit_tokens: int) -> list[MemoryHit]:
        return []

    async def recall(
        self, user_id: str, viewer: Caller, query: str, limit: int, channel: str = "", *, spares: int = 0
    ) -> list[MemoryHit]:
        return []
