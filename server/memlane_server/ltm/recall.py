"""Recall around the retrievers: the caller's query vector, fusion and ranking, speaker-aware expansion and
focus. What MemoryService.search runs before, beside and after the two retrievers; ingest and upkeep use
its ranking for pruning and repeats.

Vectors a caller hands in or asks for: a query vector for SearchMemories (a framework that embeds on
its own, CrewAI, searches by vector) and the Embed RPC, both with the model memories are indexed with.

Fusion of keyword and vector hits, then re-ranking by recency, usage and importance.

Reciprocal-rank fusion, not a sum of raw scores: BM25 and cosine live on unrelated scales, and ranks
are robust to both (Cormack et al., 2009). A small ``k`` keeps the first ranks distinct enough that
re-ranking signals refine the order instead of overturning it.

Speaker-aware expansion: candidates that the query's own words and its own vector do not reach.

On LoCoMo most of the evidence recall missed was not among the candidates at all, and most of that
was a person's own turn saying what the question asks in other words ("What activities does Melanie
partake in?" against "Melanie: I'm off to go swimming with the kids"). In the query's vector the
name weighs as much as the topic, so the top of the vector list is the turns that mention the person
most, not the ones about activities; and half the turns of a two-person talk carry that name anyway.

So when a query names speakers present in the reader's memories, the vector side searches for the
*topic*: the query with the names taken out. It is embedded instead of the query (still one text, one
model call), and searched twice in memory (hot.py): among all rows, and among only the named
speakers' spoken turns (whose they are), the second list fused as one more retriever (above).
The names still count where they are exact: in the full-text query and in focus (below). Measured on
LoCoMo (docs/benchmarks.md): embedding the query and the topic both (two texts) did no better than
the topic alone. A query naming nobody, or leaving no content word once names are out, is unchanged.

Shaping the fused result list by who the query is about, after fusion.

Fusion (above) scores each item on its own; what a query says about the people in a conversation
shows only against the whole candidate list. Episodes are written as ``[date] Speaker: what they said``.

- **Named speakers.** When a query names some of the speakers present among the candidates (not all of
  them), what those people said is the likelier answer than what others said to them (a question about
  someone is mostly answered by their own turns; the others' turns match the name because they address
  that person): their turns gain a bounded boost. A query naming nobody, or everybody, is left alone.
  Names are matched as whole words, case folded, against the speakers the candidates themselves carry:
  nothing is assumed about who talks.
- **Thin turns.** A spoken turn with almost no content words once names are set aside ("Glad it helped,
  Mel!") matches on a name or a stray word and answers nothing, yet takes a place and part of the
  reader's token budget: its score is damped in proportion, down to a floor.

Measured on LoCoMo (docs/benchmarks.md): both help multi-hop and open-domain questions. Two diversity
rules were measured too and left out because they lowered recall: maximal marginal relevance over word
overlap (near-paraphrases are rare among spoken turns), and a decay per pick from the same session
(evidence often sits in neighbouring turns of one session).

Works on the candidates the retrievers already returned: no extra query, no extra I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from .. import linear_regex
from ..embedding import Embedder
from ..errors import InvalidArgument
from .hot import HotEntry
from .model import MemoryItem, ScoredMemory, ScoreParts
from .store import Hit
from .tuning import DAY_MS, MemoryTuning
from .words import (
    STOP_WORDS,
    WORD,
    SpeakerIndex,
    content_terms,
    name_words,
    named_in,
    speaker_of_item,
)

MAX_EMBED_TEXTS = 256  # texts per Embed call
MAX_EMBED_TEXT_BYTES = 64 * 1024  # the model reads its first few hundred tokens anyway


def query_vector(values: Sequence[float], ndims: int) -> npt.NDArray[np.float32] | None:
    """A caller's query vector, checked and L2-normalized (None when there is none)."""
    if not values:
        return None
    if len(values) != ndims:
        raise InvalidArgument(f"query_vector has {len(values)} values; the embedder's have {ndims}")
    v = np.asarray(values, dtype=np.float32)
    norm = float(np.linalg.norm(v)) if np.isfinite(v).all() else 0.0
    if not norm > 0.0 or not np.isfinite(norm):
        raise InvalidArgument("query_vector must be finite and not all zero")
    return v / norm


async def embed(embedder: Embedder, texts: Sequence[str]) -> npt.NDArray[np.float32]:
    check_texts(texts)
    return await embedder.embed(list(texts))


def check_texts(texts: Sequence[str]) -> None:
    """The Embed call's own bounds: texts present, at most ``MAX_EMBED_TEXTS``, each within its bytes."""
    if not texts:
        raise InvalidArgument("texts must not be empty")
    if len(texts) > MAX_EMBED_TEXTS:
        raise InvalidArgument(f"texts holds {len(texts)} entries; at most {MAX_EMBED_TEXTS}")
    for i, t in enumerate(texts):
        if len(t.encode("utf-8", "surrogatepass")) > MAX_EMBED_TEXT_BYTES:
            raise InvalidArgument(f"texts[{i}] is longer than {MAX_EMBED_TEXT_BYTES} bytes")


# --- Fusion of keyword and vector hits, then re-ranking by recency, usage and importance.

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
    """``expanded``: the sub-queries' ranked lists (above), sharing ``policy.expansion_weight``
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


# --- Speaker-aware expansion: candidates that the query's own words and its own vector do not reach.

# A word with its possessive or contraction ("Melanie's"): the name goes, and its "'s" with it.
_TOKEN = linear_regex.compile(r"(\w+)(?:['\u2019]\w{1,2})?")


@dataclass(frozen=True, slots=True)
class SubQuery:
    text: str  # what is embedded (instead of the query)
    speakers: tuple[str, ...]  # also searched among these speakers' spoken turns only


def without_names(query: str, names: frozenset[str]) -> str:
    """The query with every word of ``names`` (case folded) removed, possessives with them."""
    kept = [m.group(0) for m in _TOKEN.finditer(query) if m.group(1).lower() not in names]
    return " ".join(kept)


def sub_query(query: str, speakers: SpeakerIndex | Iterable[str]) -> SubQuery | None:
    """The topic asked about the named speakers, or None (see the module docstring)."""
    index = speakers if isinstance(speakers, SpeakerIndex) else SpeakerIndex(speakers)
    named = index.named_in(query)
    if not named:
        return None
    topic = without_names(query, name_words(named))
    if not content_terms(topic):
        return None  # "Who is Melanie?": nothing is asked about but the person, whom the query covers
    return SubQuery(topic, tuple(sorted(named)))


def speaker_hits(
    entry: HotEntry, mask: npt.NDArray[np.bool_], sub: SubQuery, vector: npt.NDArray[np.float32], n: int
) -> list[Hit]:
    """The ``n`` turns of ``sub.speakers`` under ``mask`` nearest to the sub-query's vector."""
    return entry.top(mask & entry.spoken_by(sub.speakers), vector, n)


# --- Shaping the fused result list by who the query is about, after fusion.


SPEAKER_BOOST = 0.7  # relative gain of a named speaker's own turns
THIN_TERMS = 4  # a spoken turn with fewer content words than this (names aside) is damped proportionally
THIN_FLOOR = 0.5  # ... but never below this share of its score


def _content_words(text: str) -> set[str]:
    body = text[text.find(": ") + 2 :]
    return {w for w in (t.lower() for t in WORD.findall(body)) if w not in STOP_WORDS and len(w) > 2}


def _speaker(r: ScoredMemory) -> str:
    return speaker_of_item(r.item.kind, r.item.content)


def _weight(r: ScoredMemory, speaker: str, named: set[str], names: frozenset[str]) -> float:
    if not speaker:
        return 1.0  # a fact or a note, not a spoken turn
    w = 1.0 + SPEAKER_BOOST if speaker in named else 1.0
    n = len(_content_words(r.item.content) - names)
    return w * max(THIN_FLOOR, n / THIN_TERMS) if n < THIN_TERMS else w


def _reweighted(r: ScoredMemory, weight: float) -> ScoredMemory:
    """The score and its reported ``final`` move together (what SearchMemories shows is what ranked)."""
    if weight == 1.0:
        return r
    score = r.score * weight
    return replace(r, score=score, parts=replace(r.parts, final=score))


def focus(query: str, results: list[ScoredMemory], limit: int) -> list[ScoredMemory]:
    """The final list, cut to ``limit``: named speakers' turns boosted, thin turns damped, re-sorted."""
    spoken = [_speaker(r) for r in results]  # once each: a regex per item, on every recall
    speakers = {s for s in spoken if s}
    if not speakers:
        return results[:limit]
    named = named_in(query, speakers)
    if named == speakers:
        named = set()
    names = name_words(speakers)
    out = [_reweighted(r, _weight(r, s, named, names)) for r, s in zip(results, spoken, strict=True)]
    # The same tie-break as fusion: newer first, then the id, so results are deterministic.
    out.sort(key=lambda s: (-s.score, -s.item.updated_at_ms, s.item.id))
    return out[:limit]
