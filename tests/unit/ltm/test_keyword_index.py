"""The in-memory full-text index of a hot entry (ltm/hot.py) and how fusion reads its ties."""

from __future__ import annotations

import numpy as np
import pytest

from memlane_server.config import Settings
from memlane_server.ltm.hot import KeywordIndex, fold, stem, terms
from memlane_server.ltm.model import MemoryItem
from memlane_server.ltm.recall import fuse_and_rank
from memlane_server.ltm.store import Hit
from memlane_server.memory_kinds import MemoryKind, MemoryScope
from memlane_server.wiring.stores import memory_tuning


@pytest.mark.parametrize(
    ("words", "same"),
    [
        (["camped", "camping", "camps", "camp"], True),
        (["running", "runs", "run"], True),
        (["hiking", "hikes", "hike"], True),
        (["libraries", "library"], True),
        (["glass", "bus", "this"], False),  # no plural "s" taken off: each keeps its own form
    ],
)
def test_inflections_meet_at_one_stem(words: list[str], same: bool) -> None:
    stems = {stem(w) for w in words}
    assert (len(stems) == 1) is same, stems


def test_ids_and_numbers_are_matched_as_written() -> None:
    assert terms("SKU-4411-B and 2024") == ["sku", "4411", "b", "2024"]
    assert fold("Tromsø, Zoë, Straße") == "tromso, zoe, strasse"
    assert terms("What is the user's favourite?") == [stem("favourite")]  # stop and role words out


def test_bm25_ranks_the_rarer_word_and_the_fuller_match_first() -> None:
    index = KeywordIndex(
        [
            "User bought the standing desk SKU-4411-B in walnut.",
            "User returned the office chair SKU-3902-A.",
            "User went camping in the Alps.",
            "User camped by the lake twice.",
        ]
    )
    everyone = np.ones(4, bool)
    rows, scores = index.top("SKU-4411-B", everyone, 10)
    # The look-alike matched "sku" only: under MIN_SHARE_OF_BEST of the best, it is no keyword evidence.
    assert rows.tolist() == [0] and scores[0] > 0
    rows, _ = index.top("where did the user camp?", everyone, 10)
    assert sorted(rows.tolist()) == [2, 3]
    rows, _ = index.top("where did the user camp?", np.array([True, True, False, True]), 10)
    assert rows.tolist() == [3]  # the mask (who may see what) holds
    rows, _ = index.top("quantum chromodynamics", everyone, 10)
    assert rows.tolist() == []


def _hit(i: int, score: float) -> Hit:
    item = MemoryItem(f"m{i}", "u", "a", MemoryScope.USER, MemoryKind.FACT, f"item {i}")
    return Hit(item, score)


def test_fusion_gives_tied_keyword_scores_one_rank() -> None:
    # Two items the keyword side cannot tell apart: the vector side decides between them.
    keyword = [_hit(1, 2.4), _hit(2, 2.4)]
    vector = [_hit(2, 0.8), _hit(1, 0.5)]
    ranked = fuse_and_rank(keyword, vector, policy=memory_tuning(Settings().ltm), now_ms=0, limit=5)
    assert [r.item.id for r in ranked] == ["m2", "m1"]
    assert [r.parts.keyword_rank for r in ranked] == [1, 1]
