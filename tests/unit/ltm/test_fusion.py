"""Fusion and re-ranking (ltm/recall.py) on hand-made hits: no store, no model."""

from __future__ import annotations

from memlane_server.config import Settings
from memlane_server.ltm.model import MemoryItem
from memlane_server.ltm.recall import STALE_KEY, fuse_and_rank, prune_score, text_key
from memlane_server.ltm.store import Hit
from memlane_server.memory_kinds import MemoryKind, MemoryScope
from memlane_server.wiring.stores import memory_tuning

NOW = 1_000 * 86_400_000
TUNING = memory_tuning(Settings().ltm)


def _item(i: str, **kw: object) -> MemoryItem:
    item = MemoryItem(i, "u", "a", MemoryScope.USER, MemoryKind.FACT, f"User fact {i}.")
    item.created_at_ms = item.updated_at_ms = item.occurred_at_ms = NOW
    for name, value in kw.items():
        setattr(item, name, value)
    return item


def test_first_in_every_retriever_fuses_to_one_and_both_lists_beat_one() -> None:
    a, b, c = _item("a"), _item("b"), _item("c")
    ranked = fuse_and_rank(
        [Hit(a, 9.0), Hit(b, 5.0)], [Hit(a, 0.9), Hit(c, 0.8)], policy=TUNING, now_ms=NOW, limit=10
    )
    assert ranked[0].item.id == "a"
    assert abs(ranked[0].parts.fused - 1.0) < 1e-9
    assert (ranked[0].parts.keyword_rank, ranked[0].parts.vector_rank) == (1, 1)
    assert {r.item.id for r in ranked[1:]} == {"b", "c"}


def test_no_hits_rank_nothing_and_limit_and_min_score_cut() -> None:
    assert fuse_and_rank([], [], policy=TUNING, now_ms=NOW, limit=5) == []
    hits = [Hit(_item(str(i)), 1.0 - i / 10) for i in range(5)]
    assert len(fuse_and_rank([], hits, policy=TUNING, now_ms=NOW, limit=3)) == 3
    assert fuse_and_rank([], hits, policy=TUNING, now_ms=NOW, limit=5, min_score=10.0) == []


def test_equal_keyword_scores_share_a_rank() -> None:
    a, b = _item("a"), _item("b")
    ranked = fuse_and_rank([Hit(a, 2.0), Hit(b, 2.0)], [], policy=TUNING, now_ms=NOW, limit=5)
    assert [r.parts.keyword_rank for r in ranked] == [1, 1]


def test_a_stale_episode_and_an_old_item_rank_lower() -> None:
    fresh, stale = _item("fresh"), _item("stale", metadata={STALE_KEY: "m1"})
    ranked = fuse_and_rank([], [Hit(stale, 0.9), Hit(fresh, 0.9)], policy=TUNING, now_ms=NOW, limit=5)
    assert [r.item.id for r in ranked] == ["fresh", "stale"]
    old = _item("old", updated_at_ms=0, created_at_ms=0, occurred_at_ms=0)
    new = _item("new")
    assert prune_score(old, NOW, TUNING) < prune_score(new, NOW, TUNING)


def test_text_key_ignores_case_and_spacing_only() -> None:
    assert text_key("User  lives in Pune.") == text_key("user lives in pune.")
    assert text_key("User lives in Pune.") != text_key("User lives in Lyon.")
