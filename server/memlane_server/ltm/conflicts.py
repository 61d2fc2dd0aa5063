"""Merge-on-duplicate and supersede-on-contradiction, decided before anything is written, and the
audience rule that bounds both (who reads an item; its section below).

Pure logic over the (user, agent)'s current items and their vectors, so the rules are unit-testable
and the store sees one batched write per ingest.

Who reads an item, as one model: the rules for what a new memory may change are stated in it.

The items compared here are one user's: the drafting agent's own (ingest dedupes and supersedes
within them), whose audience is fixed by scope and group: AGENT is the writing agent alone, GROUP the
agents presenting the group, USER (and SHARED, which reaches the same agents) every agent serving the
user. Audiences nest: AGENT within any GROUP within USER. And other agents' user-wide items (see
"Across agents" below), the only ones whose readers this model names without knowing their writer.

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

**Across agents** (``may_retire_across``, ``newest_wins``): a user-wide attribute has one answer
whichever agent was told it. A draft may retire another agent's item only if both are user-wide: the
item's readers (every agent) could read the draft's source, and will read the draft's item, so every
agent that saw the old value sees the new one. An agent-private or group item of another agent is
never compared (its readers are not this model's AGENT, and no other agent may rewrite it), nor is
another agent's item merged into (it keeps its own provenance: the restatement is the drafter's own
item, and assembly shows one text once). Two agents' learning runs apart (one agent's session may be
promoted long after another's), so across agents the newest *said* wins (``occurred_at_ms``), not
the newest written: a draft said before another agent's item it contradicts is stored retired by it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from .. import linear_regex
from ..memory_kinds import MemoryDraft, MemoryKind, MemoryScope, default_scope
from .model import MemoryItem, NewMemory


class Action(enum.Enum):
    INSERT = "insert"
    MERGE = "merge"  # fold into ``target``
    SUPERSEDE = "supersede"  # insert, and retire ``retire``


@dataclass(slots=True)
class Decision:
    action: Action
    target: MemoryItem | None = None
    retire: list[MemoryItem] = field(default_factory=list)
    # A newer item (another agent's) the new one is stored retired by: it came too late to win.
    retired_by: MemoryItem | None = None


_SALIENT = linear_regex.compile(r"\b(?:[A-Z][\w'-]*|[\w-]*\d[\w-]*)")


def salient_tokens(text: str) -> set[str]:
    """Names, numbers and ids, minus the sentence-initial word: what a paraphrase keeps exactly."""
    words = _SALIENT.findall(text)
    first = text.split(maxsplit=1)[0] if text.split() else ""
    return {w.lower().strip("'") for w in words if w != first}


def same_details(a: str, b: str) -> bool:
    """Cosine cannot tell "Town1" from "Town2" or "Paris" from "Rome"; one side's names and numbers must
    contain the other's before two items count as the same thing said twice."""
    sa, sb = salient_tokens(a), salient_tokens(b)
    return sa <= sb or sb <= sa


_WORD = linear_regex.compile(r"[a-z0-9]+(?:'[a-z]+)?")
# Words that carry no detail: the subject placeholder, articles, auxiliaries, prepositions.
_FILLER = frozenset({
    "user", "user's", "the", "a", "an", "is", "are", "was", "were", "be", "been", "am", "in", "on", "at",
    "of", "to", "for", "and", "or", "with", "by", "from", "as", "it", "its", "that", "this", "these",
    "those", "my", "their", "his", "her", "our",
})  # fmt: skip


def detail_words(text: str, subject: str = "") -> set[str]:
    """The words that say something: lowercased, without the subject's name, articles, auxiliaries and
    prepositions, and with a final plural/third-person "s" dropped ("lives" and "live" are one)."""
    skip = {w for w in _WORD.findall(subject.lower())}
    out = set()
    for w in _WORD.findall(text.lower()):
        if w in _FILLER or w in skip:
            continue
        out.add(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w)
    return out


def restates(a: str, b: str, *, subject: str = "") -> bool:
    """Whether one text names nothing the other does not: every detail word of one is in the other."""
    wa, wb = detail_words(a, subject), detail_words(b, subject)
    return bool(wa and wb) and (wa <= wb or wb <= wa)


@dataclass(frozen=True, slots=True)
class Thresholds:
    duplicate: float  # near-identical wording: the same details suffice
    paraphrase: float  # other wording: no detail of one missing from the other


def is_duplicate(sim: float, new: str, old: str, t: Thresholds, subject: str = "") -> bool:
    """The same thing said twice: semantic similarity plus the names, values and details each names."""
    if sim >= t.duplicate and same_details(new, old):
        return True
    return sim >= t.paraphrase and same_details(new, old) and restates(new, old, subject=subject)


def decide(
    kind: MemoryKind,
    slot: str,
    vector: npt.NDArray[np.float32],
    *,
    content: str,
    existing: list[MemoryItem],
    existing_vectors: npt.NDArray[np.float32],
    thresholds: Thresholds,
    existing_slots: list[str] | None = None,
    subject: str = "",
) -> Decision:
    """Compare one new item with the active items of the same user/agent and the same subject (the
    caller passes only those).

    - Same slot (a single-valued attribute such as location or units; the item's own, else the one
      ``core.py`` recognises by meaning): the same thing said again merges; anything else is a new
      value, so the old ones are superseded ("lives in Bangalore" -> "Pune").
    - No slot: the most similar duplicate of the same kind absorbs it.
    Episodes never merge here: each is its own moment in time.
    """
    if kind is MemoryKind.EPISODIC or not existing:
        return Decision(Action.INSERT)
    slots = existing_slots if existing_slots is not None else [e.slot for e in existing]
    sims = existing_vectors @ vector
    same_kind = [i for i, item in enumerate(existing) if item.kind is kind]
    if slot:
        same_slot = [i for i, s in enumerate(slots) if s == slot]
        if same_slot:
            best = max(same_slot, key=lambda i: float(sims[i]))
            if is_duplicate(float(sims[best]), content, existing[best].content, thresholds, subject):
                return Decision(Action.MERGE, target=existing[best])
            return Decision(Action.SUPERSEDE, retire=[existing[i] for i in same_slot])
    for i in sorted(same_kind, key=lambda i: -float(sims[i])):
        if float(sims[i]) < min(thresholds.duplicate, thresholds.paraphrase):
            break
        # An item of another attribute is not the same thing, however alike the words.
        if slot and slots[i] and slots[i] != slot:
            continue
        if is_duplicate(float(sims[i]), content, existing[i].content, thresholds, subject):
            return Decision(Action.MERGE, target=existing[i])
    return Decision(Action.INSERT)


# --- Who reads an item, as one model: the rules for what a new memory may change are stated in it.


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


def may_retire_across(draft: MemoryDraft, kind: MemoryKind, item: MemoryItem) -> bool:
    """Whether a draft may retire ``item`` of another agent: both user-wide (see "Across agents")."""
    user = Audience(MemoryScope.USER)
    return Audience.of_item(item) == user and source(draft) == user and target(draft, kind) == user


def newest_wins(decision: Decision, said_at_ms: int, others: set[str]) -> Decision:
    """A supersede with the items of ``others`` (ids of other agents' items) ordered by when each was
    said: those said after the draft (``said_at_ms``) stay, and the draft is stored retired by the
    newest of them; the draft still retires what was said before it (its history then reads old ->
    draft -> newest). Ties go to the draft, the later written."""
    if decision.action is not Action.SUPERSEDE:
        return decision
    newer = [i for i in decision.retire if i.id in others and i.occurred_at_ms > said_at_ms]
    if not newer:
        return decision
    late = {i.id for i in newer}
    return Decision(
        Action.SUPERSEDE,
        retire=[i for i in decision.retire if i.id not in late],
        retired_by=max(newer, key=lambda i: (i.occurred_at_ms, i.id)),
    )
