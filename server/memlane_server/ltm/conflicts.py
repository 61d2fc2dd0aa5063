"""Merge-on-duplicate and supersede-on-contradiction, decided before anything is written.

Pure logic over the (user, agent)'s current items and their vectors, so the rules are unit-testable
and the store sees one batched write per ingest.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from .. import linear_regex
from .model import MemoryItem, MemoryKind


class Action(enum.Enum):
    INSERT = "insert"
    MERGE = "merge"  # fold into ``target``
    SUPERSEDE = "supersede"  # insert, and retire ``retire``


@dataclass(slots=True)
class Decision:
    action: Action
    target: MemoryItem | None = None
    retire: list[MemoryItem] = field(default_factory=list)


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


def decide(
    kind: MemoryKind,
    slot: str,
    vector: npt.NDArray[np.float32],
    *,
    content: str,
    existing: list[MemoryItem],
    existing_vectors: npt.NDArray[np.float32],
    duplicate_similarity: float,
) -> Decision:
    """Compare one new item with the active items of the same user/agent.

    - Same slot (a single-valued attribute such as location or units): near-identical wording merges;
      anything else is a new value, so the old ones are superseded ("lives in Bangalore" -> "Pune").
    - No slot: the most similar item of the same kind at or above the threshold absorbs it.
    Episodes never merge here: each is its own moment in time.
    """
    if kind is MemoryKind.EPISODIC or not existing:
        return Decision(Action.INSERT)
    sims = existing_vectors @ vector
    same_kind = [i for i, item in enumerate(existing) if item.kind is kind]
    if slot:
        same_slot = [i for i, item in enumerate(existing) if item.slot == slot]
        if same_slot:
            best = max(same_slot, key=lambda i: float(sims[i]))
            if float(sims[best]) >= duplicate_similarity and same_details(content, existing[best].content):
                return Decision(Action.MERGE, target=existing[best])
            return Decision(Action.SUPERSEDE, retire=[existing[i] for i in same_slot])
    for i in sorted(same_kind, key=lambda i: -float(sims[i])):
        if float(sims[i]) < duplicate_similarity:
            break
        if same_details(content, existing[i].content):
            return Decision(Action.MERGE, target=existing[i])
    return Decision(Action.INSERT)
