"""Who reads an item, as one model: the rules for what a new memory may change are stated in it.

All items compared here belong to one (user, agent) (ingest dedupes and supersedes within it), so an
audience is fixed by scope and group: AGENT is the writing agent alone, GROUP the agents presenting
the group, USER (and SHARED, which reaches the same agents) every agent serving the user. Audiences
nest: AGENT within any GROUP within USER.

A draft (promotion, ExtractMemories, CreateMemory) has two audiences:

- ``source``: who could read what it came from. An explicit agent or group scope says it came from a
  narrower conversation (an agent-private or group turn: see ``pipelines.promote``); without one, or
  with a user-wide one, it came from the user's own conversation.
- ``target``: who will read the item it becomes (explicit scope, else the kind's default).

The two rules of ingest then read:

- **supersede**: a draft may retire an item only if the item's readers could all read the draft's
  source (``item.within(source)``); else a narrow conversation could rewrite what wider readers see.
- **merge**: a draft folds into an item only for the very same readers (``item == target``): folded
  into a wider item, the draft would be published; into a narrower one, hidden from its own readers.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..memory_kinds import MemoryDraft, MemoryKind, MemoryScope
from .model import MemoryItem, NewMemory
from .tuning import default_scope


@dataclass(frozen=True, slots=True)
class Audience:
    scope: MemoryScope  # AGENT, GROUP or USER (SHARED is read as USER)
    group: str = ""  # GROUP only

    @classmethod
    def of(cls, scope: MemoryScope, group: str = "") -> Audience:
        if scope is MemoryScope.SHARED:
            scope = MemoryScope.USER
        return cls(scope, group if scope is MemoryScope.GROUP else "")

    @classmethod
    def of_item(cls, item: MemoryItem) -> Audience:
        return cls.of(item.scope, item.group)

    def within(self, other: Audience) -> bool:
        """Whether every reader of this audience is a reader of ``other``."""
        if other.scope is MemoryScope.USER or self.scope is MemoryScope.AGENT:
            return True
        return self == other


def _explicit(draft: MemoryDraft) -> NewMemory | None:
    """The draft's explicit scope, if it has one (only ``NewMemory`` drafts carry a scope)."""
    return draft if isinstance(draft, NewMemory) and draft.scope else None


def source(draft: MemoryDraft) -> Audience:
    """Who could read what the draft came from (see the module docstring)."""
    extra = _explicit(draft)
    return Audience.of(MemoryScope(extra.scope), extra.group) if extra else Audience(MemoryScope.USER)


def target(draft: MemoryDraft, kind: MemoryKind) -> Audience:
    """Who will read the item the draft becomes."""
    extra = _explicit(draft)
    if extra is None:
        return Audience.of(default_scope(kind))
    return Audience.of(MemoryScope(extra.scope), extra.group)


def may_supersede(draft: MemoryDraft, item: MemoryItem) -> bool:
    return Audience.of_item(item).within(source(draft))


def may_merge(draft: MemoryDraft, kind: MemoryKind, item: MemoryItem) -> bool:
    return Audience.of_item(item) == target(draft, kind)
