"""Okapi BM25 over a fixed list of documents: the keyword baseline of the evaluation.

Plain and self-contained on purpose (lower-cased word tokens, English stop words removed, k1=1.2,
b=0.75), so the baseline means the same thing in every run and owes nothing to the product's index.
"""

from __future__ import annotations

import math
import re
from collections import Counter

_WORD = re.compile(r"[a-z0-9]+")
STOP_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has
    have having he her here hers herself him himself his how i if in into is it its itself just me
    more most my myself no nor not now of off on once only or other our ours ourselves out over own
    same she should so some such than that the their theirs them themselves then there these they
    this those through to too under until up very was we were what when where which while who whom
    why will with would you your yours yourself yourselves s t""".split()  # noqa: SIM905 - a word list reads best as words
)


def tokenize(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]


class BM25:
    def __init__(self, documents: list[str], *, k1: float = 1.2, b: float = 0.75) -> None:
        self._k1, self._b = k1, b
        self._docs = [Counter(tokenize(d)) for d in documents]
        self._lengths = [sum(c.values()) for c in self._docs]
        self._avg = (sum(self._lengths) / len(self._lengths)) if self._lengths else 0.0
        df: Counter[str] = Counter()
        for c in self._docs:
            df.update(c.keys())
        n = len(self._docs)
        self._idf = {t: math.log(1.0 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def scores(self, query: str) -> list[float]:
        terms = [t for t in dict.fromkeys(tokenize(query)) if t in self._idf]
        out: list[float] = []
        for doc, length in zip(self._docs, self._lengths, strict=True):
            score = 0.0
            norm = self._k1 * (1.0 - self._b + self._b * length / self._avg) if self._avg else self._k1
            for t in terms:
                tf = doc.get(t, 0)
                if tf:
                    score += self._idf[t] * tf * (self._k1 + 1.0) / (tf + norm)
            out.append(score)
        return out

    def top(self, query: str, k: int) -> list[int]:
        """Indexes of the ``k`` best documents, best first (documents scoring 0 are left out)."""
        scored = [(s, i) for i, s in enumerate(self.scores(query)) if s > 0.0]
        scored.sort(key=lambda p: (-p[0], p[1]))
        return [i for _, i in scored[:k]]
