"""``KeywordIndex``: BM25 over one hot entry's rows, in memory, so a recall asks LanceDB nothing.

LanceDB's full-text search took 17-25 ms of a 22-29 ms recall on LoCoMo (one user's 700 items, a
table of 2,800): most of a question's latency, while the vector side over the hot entry (ltm/hot.py)
took 2 ms. A reader's rows are few (at most a few thousand: the caps in ``MemoryTuning``), so postings
of their own words, held beside the entry's vectors, answer in well under a millisecond.

What is indexed is what LanceDB indexes (``schema.search_text``: content, then keywords), analysed the
same way in spirit: lower case, accents folded, stop words out, words reduced to a stem
(``stem``: suffixes of plural, tense and manner, so "camped", "camping" and "camps" meet). Document
frequencies are the reader's own rows', not the whole table's: a word common in one user's memories is
common for that user, whatever other tenants say.

Built on first use, once per entry (``HotEntry.keyword_index``), in a thread: tokenizing 5,000 rows is
tens of milliseconds that the event loop should not wait for.
"""

from __future__ import annotations

import math
import unicodedata
from collections import Counter
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from .. import linear_regex
from .query import STOP_WORDS

K1 = 1.2
B = 0.75
# A row whose score is under this share of the best row's matched a small part of what the best one
# matched ("SKU-3902-A" against the query "SKU-4411-B": the word "sku" alone). It is no keyword
# evidence: kept in the list, its rank would outvote the vector side in fusion. (Measured: 0.4 keeps
# the golden set's figures and LoCoMo's; 0.3 lets the look-alike SKU through, 0.5 costs LoCoMo 0.4 pt.)
MIN_SHARE_OF_BEST = 0.4
_WORD = linear_regex.compile_run(r"\w+")
# Longest first: "ies" before "es" before "s".
_SUFFIXES = ("ingly", "edly", "ings", "ing", "ies", "ied", "ed", "ly", "es", "s")
_KEEP_S = ("ss", "us", "is")  # "glass", "bus", "this": not plurals
MIN_STEM = 3


def stem(word: str) -> str:
    """A light English stemmer: the suffix of plural, tense or manner off, a doubled final consonant and
    a final "e" off ("running"/"runs" -> "run", "hiking"/"hikes"/"hike" -> "hik"); short words kept."""
    if not word.isalpha():
        return word  # an id or a number ("4411", "sku4411") is matched as written
    w = word
    for suffix in _SUFFIXES:
        if w.endswith(suffix) and len(w) - len(suffix) >= MIN_STEM:
            if suffix == "s" and w.endswith(_KEEP_S):
                break
            w = w[: -len(suffix)] + ("y" if suffix in ("ies", "ied") else "")
            break
    if len(w) > MIN_STEM and w[-1] == w[-2] and w[-1] not in "aeiouslz":
        w = w[:-1]
    if len(w) > MIN_STEM and w.endswith("e"):
        w = w[:-1]
    return w


# Letters that no Unicode decomposition takes apart, folded as ASCII folding does.
_LETTERS = str.maketrans(
    {"ø": "o", "æ": "ae", "œ": "oe", "ß": "ss", "đ": "d", "ł": "l", "þ": "th", "\u0131": "i"}  # dotless i
)


def fold(text: str) -> str:
    """Lower case without accents ("Zoë" -> "zoe", "Tromsø" -> "tromso")."""
    decomposed = unicodedata.normalize("NFKD", text.lower().translate(_LETTERS))
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def terms(text: str) -> list[str]:
    """The stems of ``text``'s words that are not stop words, in order (repeats kept: term frequency)."""
    return [stem(w) for w in _WORD.findall(fold(text)) if w not in STOP_WORDS]


class KeywordIndex:
    """Postings (row numbers and term counts per stem) of a fixed list of texts, scored by Okapi BM25."""

    def __init__(self, texts: Sequence[str]) -> None:
        self._n = len(texts)
        rows: dict[str, list[int]] = {}
        counts: dict[str, list[int]] = {}
        lengths = np.zeros(self._n, np.float32)
        for i, text in enumerate(texts):
            bag = Counter(terms(text))
            lengths[i] = sum(bag.values())
            for term, tf in bag.items():
                rows.setdefault(term, []).append(i)
                counts.setdefault(term, []).append(tf)
        self._rows = {t: np.asarray(r, np.int64) for t, r in rows.items()}
        self._tf = {t: np.asarray(c, np.float32) for t, c in counts.items()}
        avg = float(lengths.mean()) if self._n else 0.0
        # The length part of BM25's denominator, per row: K1 * (1 - B + B * length / average).
        self._norm = K1 * (1.0 - B + B * lengths / avg) if avg else np.full(self._n, K1, np.float32)

    def __len__(self) -> int:
        return self._n

    def idf(self, term: str) -> float:
        df = len(self._rows.get(term, ()))
        return math.log(1.0 + (self._n - df + 0.5) / (df + 0.5))

    def scores(self, query: str) -> npt.NDArray[np.float32]:
        """BM25 of every row for ``query``'s terms (each counted once); 0 where none matches."""
        out = np.zeros(self._n, np.float32)
        for term in dict.fromkeys(terms(query)):
            rows = self._rows.get(term)
            if rows is None:
                continue
            tf = self._tf[term]
            out[rows] += self.idf(term) * tf * (K1 + 1.0) / (tf + self._norm[rows])
        return out

    def top(
        self, query: str, mask: npt.NDArray[np.bool_], n: int
    ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float32]]:
        """Row numbers of the ``n`` best rows under ``mask`` that match well enough (``MIN_SHARE_OF_BEST``),
        best first, and their scores. Ties go to the lower row number (deterministic); fusion gives tied
        rows one rank (ranking.py)."""
        scores = self.scores(query)
        scores[~mask] = 0.0
        hits = np.flatnonzero(scores > 0.0)
        if not len(hits) or n <= 0:
            return np.zeros(0, np.intp), np.zeros(0, np.float32)
        hits = hits[scores[hits] >= MIN_SHARE_OF_BEST * float(scores[hits].max())]
        order = np.lexsort((hits, -scores[hits]))[:n]
        best = hits[order]
        return best, scores[best]
