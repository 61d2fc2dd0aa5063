"""Scoring retrieved results against a question's evidence turns.

A result is what a retriever returned: its text (what an agent would read, so what the token budget
pays for) and the turn ids it covers (its provenance). Recall within a budget takes results in rank
order while their texts fit in the budget: the budget makes item size irrelevant, so a retriever
cannot win by returning bigger items.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..ltm.recall import text_key

BUDGETS = (256, 512, 1024)
CUTOFFS = (5, 10)


@dataclass(frozen=True, slots=True)
class Retrieved:
    text: str
    turn_ids: tuple[str, ...]
    tokens: int


@dataclass(slots=True)
class Scores:
    """Per-question scores; ``add`` accumulates them for a category or a whole run."""

    within: dict[int, list[float]] = field(default_factory=lambda: {b: [] for b in BUDGETS})
    at: dict[int, list[float]] = field(default_factory=lambda: {k: [] for k in CUTOFFS})
    reciprocal_ranks: list[float] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.reciprocal_ranks)

    def add(self, results: Sequence[Retrieved], evidence: frozenset[str]) -> None:
        for budget in BUDGETS:
            covered: set[str] = set()
            used = 0
            for r in results:
                if used + r.tokens > budget:
                    break
                used += r.tokens
                covered.update(r.turn_ids)
            self.within[budget].append(len(covered & evidence) / len(evidence))
        for k in CUTOFFS:
            top = {t for r in results[:k] for t in r.turn_ids}
            self.at[k].append(len(top & evidence) / len(evidence))
        rank = next((i for i, r in enumerate(results, 1) if evidence.intersection(r.turn_ids)), 0)
        self.reciprocal_ranks.append(1.0 / rank if rank else 0.0)

    def merge(self, other: Scores) -> None:
        for b in BUDGETS:
            self.within[b] += other.within[b]
        for k in CUTOFFS:
            self.at[k] += other.at[k]
        self.reciprocal_ranks += other.reciprocal_ranks

    def summary(self) -> dict[str, float]:
        mean: Callable[[list[float]], float] = lambda xs: statistics.fmean(xs) if xs else 0.0  # noqa: E731
        out = {f"recall@{b}tok": mean(self.within[b]) for b in BUDGETS}
        out.update({f"R@{k}": mean(self.at[k]) for k in CUTOFFS})
        out["MRR"] = mean(self.reciprocal_ranks)
        out["n"] = float(self.n)
        return out


def repeats_within(results: Sequence[Retrieved], budget: int) -> tuple[int, int]:
    """How many of the results a reader gets within ``budget`` repeat an earlier one's text (case and
    spacing aside), and the tokens they cost: context spent on saying one thing twice."""
    seen: set[str] = set()
    used = count = tokens = 0
    for r in results:
        if used + r.tokens > budget:
            break
        used += r.tokens
        key = text_key(r.text)
        if key in seen:
            count += 1
            tokens += r.tokens
        seen.add(key)
    return count, tokens


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty list."""
    if not values:
        return 0.0
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return ordered[index]
