"""Shaping the fused result list by who the query is about, after fusion.

Fusion (ranking.py) scores each item on its own; what a query says about the people in a conversation
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

from dataclasses import replace

from .model import ScoredMemory
from .query import STOP_WORDS
from .speakers import WORD, name_words, named_in, speaker_of, speaker_of_item

__all__ = ["focus", "speaker_of"]

SPEAKER_BOOST = 0.7  # relative gain of a named speaker's own turns
THIN_TERMS = 4  # a spoken turn with fewer content words than this (names aside) is damped proportionally
THIN_FLOOR = 0.5  # ... but never below this share of its score


def _content_words(text: str) -> set[str]:
    body = text[text.find(": ") + 2 :]
    return {w for w in (t.lower() for t in WORD.findall(body)) if w not in STOP_WORDS and len(w) > 2}


def _speaker(r: ScoredMemory) -> str:
    return speaker_of_item(r.item.kind, r.item.content)


def _weight(r: ScoredMemory, named: set[str], names: frozenset[str]) -> float:
    speaker = _speaker(r)
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
    speakers = {s for r in results if (s := _speaker(r))}
    if not speakers:
        return results[:limit]
    named = named_in(query, speakers)
    if named == speakers:
        named = set()
    names = name_words(speakers)
    out = [_reweighted(r, _weight(r, named, names)) for r in results]
    # The same tie-break as fusion: newer first, then the id, so results are deterministic.
    out.sort(key=lambda s: (-s.score, -s.item.updated_at_ms, s.item.id))
    return out[:limit]
