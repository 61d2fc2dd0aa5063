"""What of a recall query goes to the full-text index.

Only content words: function words and question words match almost every item, so they add nothing
but noise to BM25 (and cost a posting-list scan each). "user" and "assistant" are stop words here
too: memories are written about "the user" ("User lives in Pune."), so in a query they name the
memory's owner, not what is asked about. A query with no content word skips the full-text retriever.
Terms are bare words: punctuation never reaches the index, so user text cannot be read as query syntax.
"""

from __future__ import annotations

from .. import linear_regex

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
