"""Fusion of keyword and vector hits, then re-ranking by recency, usage and importance.

Reciprocal-rank fusion, not a sum of raw scores: BM25 and cosine live on unrelated scales, and ranks
are robust to both (Cormack et al., 2009). A small ``k`` keeps the first ranks distinct enough that
re-ranking signals refine the order instead of overturning it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .model import MemoryItem, ScoredMemory, ScoreParts
from .store import Hit
from .tuning import DAY_MS, MemoryTuning

# Set by ingest on an episode that carries a superseded fact (the fact's id).
STALE_KEY = "superseded_fact"


@dataclass(slots=True)
class _Candidate:
    item: MemoryItem
    parts: ScoreParts


def recency(item: MemoryItem, now_ms: int, half_life_days: float) -> float:
    """1.0 for "just now", halving every half-life since the item was last touched or used."""
    touched = max(item.last_used_at_ms, item.updated_at_ms, item.occurred_at_ms, item.created_at_ms)
    age_days = max(0.0, (now_ms - touched) / DAY_MS)
    return math.pow(0.5, age_days / half_life_days) if half_life_days > 0 else 1.0


def usage(item: MemoryItem, saturation: int) -> float:
    """Log-saturating: the first few uses matter, the hundredth barely."""
    if item.usage_count <= 0:
        return 0.0
    return min(1.0, math.log1p(item.usage_count) / math.log1p(max(1, saturation)))


def fuse_and_rank(
    keyword_hits: list[Hit],
    vector_hits: list[Hit],
    *,
    policy: MemoryTuning,
    now_ms: int,
    limit: int,
    min_score: float = 0.0,
    expanded: Sequence[list[Hit]] = (),
) -> list[ScoredMemory]:
    """``expanded``: the sub-queries' ranked lists (expansion.py), sharing ``policy.expansion_weight``
    between them: together they weigh what one more retriever would, however many there are."""
    w_keyword = policy.keyword_weight if keyword_hits else 0.0
    w_vector = policy.vector_weight if vector_hits else 0.0
    lists = [hits for hits in expanded if hits]
    w_each = policy.expansion_weight / len(lists) if lists else 0.0
    if w_keyword + w_vector + w_each * len(lists) <= 0.0:
        return []
    k = policy.rrf_k
    # Normalized so that first place in every retriever that returned anything scores 1.0.
    norm = (k + 1.0) / (w_keyword + w_vector + w_each * len(lists))
    by_id: dict[str, _Candidate] = {}
    for rank, hit in zip(_shared_ranks(keyword_hits), keyword_hits, strict=True):
        cand = by_id.setdefault(hit.item.id, _Candidate(hit.item, ScoreParts()))
        cand.parts.keyword_rank = rank
        cand.parts.keyword_score = hit.score
        cand.parts.fused += w_keyword * norm / (k + rank)
    for rank, hit in enumerate(vector_hits, start=1):
        cand = by_id.setdefault(hit.item.id, _Candidate(hit.item, ScoreParts()))
        cand.parts.vector_rank = rank
        cand.parts.vector_similarity = hit.score
        cand.parts.fused += w_vector * norm / (k + rank)
    for hits in lists:
        for rank, hit in enumerate(hits, start=1):
            cand = by_id.setdefault(hit.item.id, _Candidate(hit.item, ScoreParts()))
            cand.parts.fused += w_each * norm / (k + rank)
    scored: list[ScoredMemory] = []
    for cand in by_id.values():
        p = cand.parts
        p.recency = recency(cand.item, now_ms, policy.recency_half_life_days)
        p.usage = usage(cand.item, policy.usage_saturation)
        p.importance = min(1.0, max(0.0, cand.item.importance))
        p.final = p.fused * (
            policy.weight_base
            + policy.weight_recency * p.recency
            + policy.weight_usage * p.usage
            + policy.weight_importance * p.importance
        )
        if cand.item.metadata.get(STALE_KEY):  # an episode whose fact was superseded (ingest.py)
            p.final *= policy.stale_episode_factor
        if p.final >= min_score:
            scored.append(ScoredMemory(cand.item, p.final, p))
    # Ties (rare) go to the newer item, then the id, so results are deterministic.
    scored.sort(key=lambda s: (-s.score, -s.item.updated_at_ms, s.item.id))
    return scored[:limit]


def _shared_ranks(hits: list[Hit]) -> list[int]:
    """1-based ranks where hits of equal score share the best one ("1, 2, 2, 2, 5"): a retriever that
    scores two items alike has no order between them, and an arbitrary one would decide fusion."""
    ranks: list[int] = []
    for i, hit in enumerate(hits):
        tied = i > 0 and math.isclose(hit.score, hits[i - 1].score, rel_tol=1e-6)
        ranks.append(ranks[-1] if tied else i + 1)
    return ranks


def text_key(content: str) -> str:
    """Two memories with this key say the same words (case and spacing aside): one reaches a reader."""
    return " ".join(content.casefold().split())


def prune_score(item: MemoryItem, now_ms: int, policy: MemoryTuning) -> float:
    """What keeping an item is worth when a (user, agent) is over its cap: lowest goes first."""
    return (
        0.5 * min(1.0, max(0.0, item.importance))
        + 0.3 * recency(item, now_ms, policy.recency_half_life_days)
        + 0.2 * usage(item, policy.usage_saturation)
    )
