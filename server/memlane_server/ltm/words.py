"""The words recall reads: what of a query goes to the full-text index, and who said a spoken turn.

What of a recall query goes to the full-text index.

Only content words: function words and question words match almost every item, so they add nothing
but noise to BM25 (and cost a posting-list scan each). "user" and "assistant" are stop words here
too: memories are written about "the user" ("User lives in Pune."), so in a query they name the
memory's owner, not what is asked about. A query with no content word skips the full-text retriever.
Terms are bare words: punctuation never reaches the index, so user text cannot be read as query syntax.

Who said a spoken turn, and which speakers a query names.

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

_TERM = linear_regex.compile_run(r"\w+")
# Function and question words (English), plus the two role words memories are written about.
_STOP_TEXT = """a about above after again against all also am an and any are as at be because been before
    being below between both but by can could did do does doing done down during each either ever
    few for from further had has have having he her here hers herself him himself his how i if in
    into is it its itself just let me more most my myself no nor not now of off on once only or
    other our ours ourselves out over own same shall she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up upon us
    very was we were what whats when where which while who whom whose why will with would yet you
    your yours yourself yourselves s t d ll m re ve user users assistant"""
STOP_WORDS = frozenset(_STOP_TEXT.split())


def content_terms(text: str) -> list[str]:
    """The query's content words, in order, each once (case kept: the index folds case itself)."""
    terms = [t for t in _TERM.findall(text) if t.lower() not in STOP_WORDS]
    return list(dict.fromkeys(terms))


# --- Who said a spoken turn, and which speakers a query names.

# "[12 May 2023] Caroline: ..." or "Caroline: ...": a name of one to four words before the first colon
# (a longer lead-in, "We debugged the failover: ...", is a sentence, not a speaker).
_SPEAKER = linear_regex.compile(r"^(?:\[[^\]]{1,40}\]\s*)?([\w.'-]+(?: [\w.'-]+){0,3}):\s")
# The same rule in RE2's syntax, for a whole column at once (Arrow runs it in C++, without the GIL):
# RE2's \w is ASCII only, so letters and digits are spelled out as Unicode classes.
_SPEAKER_RE2 = r"^(?:\[[^\]]{1,40}\]\s*)?(?P<speaker>[\pL\pN_.'-]+(?: [\pL\pN_.'-]+){0,3}):\s"
WORD = linear_regex.compile_run(r"\w+")


def still_said(keywords: Iterable[str], content: str) -> list[str]:
    """The keywords every word of which the content still holds (case folded): what an edit of the text
    leaves true of its old keys."""
    words = {w.casefold() for w in WORD.findall(content)}
    return [k for k in keywords if (parts := WORD.findall(k)) and all(p.casefold() in words for p in parts)]


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
