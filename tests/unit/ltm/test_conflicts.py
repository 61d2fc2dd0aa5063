"""What a new memory does to the stored ones (ltm/conflicts.py): merge, supersede or insert, on
hand-made vectors."""

from __future__ import annotations

import numpy as np

from memlane_server.ltm.conflicts import Action, Thresholds, decide
from memlane_server.ltm.model import MemoryItem
from memlane_server.memory_kinds import MemoryKind, MemoryScope

T = Thresholds(duplicate=0.9, paraphrase=0.75)
X = np.array([1.0, 0.0], dtype=np.float32)
Y = np.array([0.0, 1.0], dtype=np.float32)


def _item(content: str, kind: MemoryKind = MemoryKind.FACT, slot: str = "") -> MemoryItem:
    return MemoryItem("m1", "u", "a", MemoryScope.USER, kind, content, slot=slot)


def _decide(kind: MemoryKind, slot: str, content: str, old: MemoryItem, vector: np.ndarray) -> Action:
    stored = np.stack([X])
    return decide(
        kind, slot, vector, content=content, existing=[old], existing_vectors=stored, thresholds=T
    ).action


def test_a_new_value_of_a_slot_supersedes_and_the_same_value_merges() -> None:
    old = _item("User lives in Bangalore.", slot="location")
    assert _decide(MemoryKind.FACT, "location", "User lives in Pune.", old, Y) is Action.SUPERSEDE
    assert _decide(MemoryKind.FACT, "location", "User lives in Bangalore.", old, X) is Action.MERGE


def test_without_a_slot_only_a_close_duplicate_of_the_same_kind_merges() -> None:
    old = _item("User likes green tea.")
    assert _decide(MemoryKind.FACT, "", "User likes green tea.", old, X) is Action.MERGE
    assert _decide(MemoryKind.FACT, "", "User likes green tea.", old, Y) is Action.INSERT
    assert _decide(MemoryKind.PREFERENCE, "", "User likes green tea.", old, X) is Action.INSERT


def test_episodes_never_merge() -> None:
    old = _item("[1 May 2024] Ada: hello", kind=MemoryKind.EPISODIC)
    assert _decide(MemoryKind.EPISODIC, "", "[1 May 2024] Ada: hello", old, X) is Action.INSERT
