"""The kinds and scopes of a long-term memory, listed once, and the draft a memory starts as.

A leaf (it imports nothing of the package) so that both sides of promotion share it: ``extraction/``
states drafts and never imports ``ltm/``, ``ltm/`` stores them, and ``api/`` maps the two enums to their
``memlane.v1`` twins through checked bridges (``api/enums.py``) that fail at import when a value is added on
one side only. Adding a kind is: its proto value, its member here with its default scope
(``DEFAULT_SCOPE``), a rule that states it (``extraction/rules.py``), a test; what the other packages know
per kind is derived from this list.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class MemoryKind(enum.StrEnum):
    FACT = "fact"
    PREFERENCE = "preference"
    EPISODIC = "episodic"
    INSTRUCTION = "instruction"


class MemoryScope(enum.StrEnum):
    """Who may recall an item. Every scope stays inside one user: nothing ever crosses users.

    USER: every agent serving the user. AGENT: only ``agent_id``. GROUP: only agents that present
    ``group``. SHARED: like USER, but written on purpose for hand-off between agents (kept apart so a
    viewer can tell an agent's notes from things the user asked to share).
    """

    USER = "user"
    AGENT = "agent"
    GROUP = "group"
    SHARED = "shared"


# Who may recall an item of a kind when its writer names no scope (CreateMemory without one, every
# extracted item). Facts and preferences describe the user, so every agent may use them; instructions
# and episodes were given to one agent, so they stay with it unless the caller says otherwise.
DEFAULT_SCOPE: dict[MemoryKind, MemoryScope] = {
    MemoryKind.FACT: MemoryScope.USER,
    MemoryKind.PREFERENCE: MemoryScope.USER,
    MemoryKind.EPISODIC: MemoryScope.AGENT,
    MemoryKind.INSTRUCTION: MemoryScope.AGENT,
}
if _undeclared := [k.value for k in MemoryKind if k not in DEFAULT_SCOPE]:
    # At import, not at the first write of such an item: a kind is not listed until its scope is.
    raise RuntimeError(f"memory kinds without a default scope in DEFAULT_SCOPE: {_undeclared}")


def default_scope(kind: MemoryKind) -> MemoryScope:
    """The scope an item of ``kind`` gets when its writer names none (``DEFAULT_SCOPE``)."""
    return DEFAULT_SCOPE[kind]


# The kinds an extractor may state from what was said. Episodes are not stated: extraction builds them
# from the turns themselves (``extraction/episodes.py``), so a model is never offered that kind.
STATED_KINDS: tuple[MemoryKind, ...] = tuple(k for k in MemoryKind if k is not MemoryKind.EPISODIC)


@dataclass(slots=True)
class MemoryDraft:
    """A candidate memory: what an extractor states and ingestion takes (``ltm.NewMemory`` adds the
    fields only CreateMemory sets). ``kind`` is a ``MemoryKind`` value."""

    kind: str
    content: str
    keywords: list[str] = field(default_factory=list)
    # Single-valued attribute ("location", "units", "name"): a later value supersedes an earlier one.
    slot: str = ""
    importance: float = 0.5
    source_message_ids: list[str] = field(default_factory=list)
    # When the remembered thing happened (an episode's first turn); 0 for "when it was stored".
    occurred_at_ms: int = 0
    # Whose it is ("subject": a participant's name, absent for the user) and when a relative time
    # it names falls ("resolved_time"); stored with the item (see ltm/ingest.py for the keys).
    metadata: dict[str, str] = field(default_factory=dict)
