"""Single-valued attributes: one name per attribute, and the slot of an item that names none.

**One name per attribute.** Callers name slots freely (``home_city`` through ``remember``, ``location``
from the rule extractor, ``lives_in`` from an LLM's output), and newest-wins only works when two items
stating one attribute meet under one slot. ``canonical_slot`` folds every name of a family to the
family's name (the rule extractor's); it runs at every write (ingest, update) and on stored items when
they are compared, so items written before a name joined a family meet too.

**By wording.** A statement of the common attributes in the usual third-person shapes ("Lives in
Munich.", "User works at Acme.") names its slot by its first words (``slot_by_wording``), whoever
wrote it.

**By meaning.**
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

from .. import linear_regex
from ..embedding import Embedder

# family -> the other names callers give it. The families are the rule extractor's slots.
FAMILIES: dict[str, tuple[str, ...]] = {
    "name": ("full_name", "user_name", "preferred_name"),
    "location": (
        "home_city", "city", "lives_in", "living_in", "address", "town", "home",
        "residence", "current_city", "current_location", "based_in", "home_location", "city_of_residence",
    ),
    "hometown": ("home_town", "birthplace", "place_of_birth", "born_in", "grew_up_in", "origin"),
    "employer": (
        "company", "works_at", "work_place", "workplace", "employer_name", "works_for", "organization",
    ),
    "job": ("occupation", "profession", "job_title", "role", "position", "works_as"),
    "diet": ("dietary_preference", "diet_type", "dietary_restriction"),
    "units": ("unit_system", "measurement_units", "unit_preference", "measurement_system"),
    "temperature_unit": ("temperature_units", "temperature_scale"),
    "timezone": ("time_zone", "tz"),
    "reply_language": ("preferred_language", "response_language", "answer_language"),
}  # fmt: skip
_FAMILY_OF = {alias: family for family, aliases in FAMILIES.items() for alias in (family, *aliases)}
_SEPARATORS = linear_regex.compile(r"[\s\-./]+")
MAX_SLOT_CHARS = 128


def canonical_slot(slot: str) -> str:
    """The family name of ``slot`` ("Home City", "home-city" and "home_city" are ``location``); a name
    no family holds is kept, folded the same way. A "favorite:<thing>" slot keeps its thing."""
    folded = _SEPARATORS.sub("_", slot.strip().lower()).strip("_")[:MAX_SLOT_CHARS]
    head, sep, rest = folded.partition(":")
    if sep:
        return f"{_FAMILY_OF.get(head, head)}:{rest.strip('_')}"
    return _FAMILY_OF.get(folded, folded)


# "(The) user('s) / I" then the attribute's verb: the shapes memories are written in.
_SUBJECT = r"^(?:the\s+)?(?:user(?:'s)?\s+|i\s+|i'm\s+|i\s+am\s+)?(?:is\s+)?(?:now\s+|currently\s+)?"
_WORDING: tuple[tuple[str, linear_regex.Pattern], ...] = tuple(
    (slot, linear_regex.compile(_SUBJECT + pattern, ignore_case=True))
    for slot, pattern in (
        ("location", r"(?:lives|live|living|resides|based|located)\s+in\s+\S"),
        ("hometown", r"(?:(?:is|am|i'm)\s+from|comes\s+from|grew\s+up\s+in|was\s+born\s+in)\s+\S"),
        ("employer", r"(?:works|work|working|employed)\s+(?:at|for|by)\s+\S"),
        ("job", r"(?:works|work|working|employed)\s+as\s+\S"),
        ("name", r"name\s+is\s+\S"),
    )
)


def stated_slot(given: str, content: str) -> str:
    """The slot an item is stored with: the one it was given, in its family's name, else the one its
    wording names ("" if neither: meaning alone is not stored, ``SlotReader`` re-reads it on comparison)."""
    return canonical_slot(given) or slot_by_wording(content)


def slot_by_wording(content: str) -> str:
    """The slot a statement names by its first words ("Lives in Munich." is ``location``), or ""."""
    head = content.strip()[:200]
    return next((slot for slot, pattern in _WORDING if pattern.search(head)), "")


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

    def slot_of(self, given: str, content: str, vector: npt.NDArray[np.float32]) -> str:
        """The slot an item is compared under: ``stated_slot``, else the one recognised by meaning."""
        return stated_slot(given, content) or self.infer(vector[None, :])[0]

    def slots_of(self, given: list[str], contents: list[str], vectors: npt.NDArray[np.float32]) -> list[str]:
        """``slot_of`` of many items (one matrix product for those that need meaning)."""
        out = [stated_slot(g, c) for g, c in zip(given, contents, strict=True)]
        bare = [i for i, s in enumerate(out) if not s]
        if bare:
            for i, slot in zip(bare, self.infer(vectors[bare]), strict=True):
                out[i] = slot
        return out

    def infer(self, vectors: npt.NDArray[np.float32]) -> list[str]:
        """Per row of ``vectors`` (unit vectors), the slot it states, or "" (call ``ready`` first)."""
        if self._matrix is None or not len(vectors):
            return [""] * len(vectors)
        sims = vectors @ self._matrix.T
        best = np.argmax(sims, axis=1)
        return [self._names[int(j)] if float(sims[i, j]) >= self._min else "" for i, j in enumerate(best)]
