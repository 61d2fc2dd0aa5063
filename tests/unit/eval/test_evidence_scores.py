"""Scoring retrieved results against a question's evidence (eval/evidence.py): recall within a token
budget stops at the first result that does not fit, recall@k counts the top k, the reciprocal rank is
that of the first result holding evidence; percentiles are nearest-rank. Pure: no sidecar, no model."""

from __future__ import annotations

import pytest

from memlane_server.eval.evidence import BUDGETS, CUTOFFS, Retrieved, Scores, percentile

EVIDENCE = frozenset({"D1:1", "D1:2"})


def _r(tokens: int, *turns: str) -> Retrieved:
    return Retrieved(text=" ".join(turns) or "nothing", turn_ids=turns, tokens=tokens)


def test_budget_recall_takes_results_in_rank_order_while_they_fit() -> None:
    assert BUDGETS[0] == 256  # the figures below are read at the smallest budget
    scores = Scores()
    # 200 tokens fit in 256; the next (100) does not, so the later small one is never read either.
    scores.add([_r(200, "D1:1"), _r(100, "D1:2"), _r(10, "D1:2")], EVIDENCE)
    assert scores.within[256] == [0.5]
    assert scores.within[512] == [1.0]


def test_recall_at_k_and_reciprocal_rank() -> None:
    assert CUTOFFS == (5, 10)
    scores = Scores()
    misses = [_r(1, f"D9:{i}") for i in range(5)]
    scores.add([*misses, _r(1, "D1:1", "D1:2")], EVIDENCE)  # the evidence is sixth
    assert scores.at[5] == [0.0]
    assert scores.at[10] == [1.0]
    assert scores.reciprocal_ranks == [pytest.approx(1 / 6)]
    assert scores.summary()["n"] == 1.0


def test_nothing_found_scores_zero_and_merge_pools_questions() -> None:
    a, b = Scores(), Scores()
    a.add([_r(1, "D9:9")], EVIDENCE)
    b.add([_r(1, "D1:1")], EVIDENCE)
    a.merge(b)
    assert a.reciprocal_ranks == [0.0, 1.0]
    assert a.summary()["MRR"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [([3.0, 1.0, 2.0], 50, 2.0), ([3.0, 1.0, 2.0], 100, 3.0), ([5.0], 1, 5.0), ([], 50, 0.0)],
)
def test_percentile_is_nearest_rank(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == expected
