"""Single-valued attributes recognised by meaning: the slot of an item that names none.

An extractor sets a slot where its pattern knows the attribute ("I live in ..." is ``location``); an
explicit memory, an LLM's output or a wording no pattern knows comes without one, and then a changed
preference could never retire the old one. Each attribute here is described once, in words; an item
whose vector is close enough to a description states that attribute, whatever its phrasing ("User
prefers answers in imperial units.", "Use the metric system."). No list of change phrases ("now",
"switched to") is involved: the newer of two items stating one attribute wins, whatever it says.

Only attributes whose description stands apart from everyday statements under the embedding model are
listed (measured with MiniLM on hand-written items, not on any benchmark: a unit preference scores
0.59-0.75 against its description, unrelated preferences and facts 0.08-0.46). Places, employers and
jobs are not: their items are dominated by the names in them, so cosine cannot tell "lives in" from
"works at" (0.74 against 0.79 with the names masked); those keep the extractor's slot.
"""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt

from ..embedding import Embedder

# slot -> what it means (the slot names are those the rule extractor and the golden set use).
DESCRIPTIONS: dict[str, str] = {
    "units": "Prefers metric or imperial units of measurement.",
    "temperature_unit": "Prefers temperatures in Celsius or Fahrenheit.",
    "diet": "Follows a vegetarian, vegan or other diet.",
    "timezone": "The time zone the person is in.",
    "reply_language": "The language answers should be written in.",
}


class SlotReader:
    """The descriptions' vectors, embedded once per process on first use."""

    def __init__(self, embedder: Embedder, *, min_similarity: float) -> None:
        self._embedder = embedder
        self._min = min_similarity
        self._names = list(DESCRIPTIONS)
        self._matrix: npt.NDArray[np.float32] | None = None
        self._lock = asyncio.Lock()

    async def ready(self) -> None:
        if self._matrix is not None:
            return
        async with self._lock:
            if self._matrix is None:
                self._matrix = await self._embedder.embed([DESCRIPTIONS[n] for n in self._names])

    def infer(self, vectors: npt.NDArray[np.float32]) -> list[str]:
        """Per row of ``vectors`` (unit vectors), the slot it states, or "" (call ``ready`` first)."""
        if self._matrix is None or not len(vectors):
            return [""] * len(vectors)
        sims = vectors @ self._matrix.T
        best = np.argmax(sims, axis=1)
        return [self._names[int(j)] if float(sims[i, j]) >= self._min else "" for i, j in enumerate(best)]
