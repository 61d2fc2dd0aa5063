"""Who said a spoken turn, and which speakers a query names.

Episodes are written as ``[date] Speaker: what they said`` (extraction/episodes.py). Recall reads the
speaker back from that shape in two places: focus (re-weighting the fused list) and expansion (a
sub-query over one person's own turns). Both must agree on who a query names, so the rule lives here.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from .. import linear_regex
from ..memory_kinds import MemoryKind
from .query import STOP_WORDS

# "[12 May 2023] Caroline: ..." or "Caroline: ...": a name of one to four words before the first colon
# (a longer lead-in, "We debugged the failover: ...", is a sentence, not a speaker).
_SPEAKER = linear_regex.compile(r"^(?:\[[^\]]{1,40}\]\s*)?([\w.'-]+(?: [\w.'-]+){0,3}):\s")
# The same rule in RE2's syntax, for a whole column at once (Arrow runs it in C++, without the GIL):
# RE2's \w is ASCII only, so letters and digits are spelled out as Unicode classes.
_SPEAKER_RE2 = r"^(?:\[[^\]]{1,40}\]\s*)?(?P<speaker>[\pL\pN_.'-]+(?: [\pL\pN_.'-]+){0,3}):\s"
WORD = linear_regex.compile_run(r"\w+")


def speaker_of(content: str) -> str:
    m = _SPEAKER.match(content)
    return m.group(1).strip() if m else ""


def speaker_of_item(kind: MemoryKind, content: str) -> str:
    """Only episodes are spoken turns; an instruction "From now on: ..." names no speaker."""
    return speaker_of(content) if kind is MemoryKind.EPISODIC else ""


def speaker_column(meta: pa.Table) -> pa.Array:
    """``speaker_of_item`` of every row of a table with ``kind`` and ``content``: null where none."""
    found = pc.struct_field(pc.extract_regex(meta["content"], _SPEAKER_RE2), [0])
    spoken = pc.fill_null(pc.equal(meta["kind"], MemoryKind.EPISODIC.value), False)
    column = pc.if_else(spoken, found, pa.scalar(None, pa.string()))
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


class SpeakerIndex:
    """Speakers by the first word of their name, so which ones a query names costs the query's words,
    not the number of speakers (a reader's entry may hold thousands of distinct names, and recall asks
    on every query)."""

    def __init__(self, speakers: Iterable[str]) -> None:
        self._by_word: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
        for s in speakers:
            parts = tuple(p.lower() for p in WORD.findall(s)) if s else ()
            # Role words ("User", "Assistant") name no one: in a query "the user" is the memory's
            # owner, not a person in the talk.
            if parts and not all(p in STOP_WORDS for p in parts):
                self._by_word.setdefault(parts[0], []).append((s, parts))

    def named_in(self, query: str) -> set[str]:
        """The speakers whose every name word is a word of the query (case folded)."""
        words = {w.lower() for w in WORD.findall(query)}
        return {s for w in words for s, parts in self._by_word.get(w, ()) if all(p in words for p in parts)}


def named_in(query: str, speakers: Iterable[str]) -> set[str]:
    """``SpeakerIndex.named_in`` for a few speakers at hand."""
    return SpeakerIndex(speakers).named_in(query)


def name_words(speakers: Iterable[str]) -> frozenset[str]:
    return frozenset(w.lower() for s in speakers for w in WORD.findall(s))
