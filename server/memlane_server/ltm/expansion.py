"""Speaker-aware expansion: candidates that the query's own words and its own vector do not reach.

On LoCoMo most of the evidence recall missed was not among the candidates at all, and most of that
was a person's own turn saying what the question asks in other words ("What activities does Melanie
partake in?" against "Melanie: I'm off to go swimming with the kids"). In the query's vector the
name weighs as much as the topic, so the top of the vector list is the turns that mention the person
most, not the ones about activities; and half the turns of a two-person talk carry that name anyway.

So when a query names speakers present in the reader's memories, the vector side searches for the
*topic*: the query with the names taken out. It is embedded instead of the query (still one text, one
model call), and searched twice in memory (hot.py): among all rows, and among only the named
speakers' spoken turns (whose they are), the second list fused as one more retriever (ranking.py).
The names still count where they are exact: in the full-text query and in focus.py. Measured on
LoCoMo (docs/benchmarks.md): embedding the query and the topic both (two texts) did no better than
the topic alone. A query naming nobody, or leaving no content word once names are out, is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from .. import linear_regex
from .hot import HotEntry
from .query import content_terms
from .speakers import SpeakerIndex, name_words
from .store import Hit

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
