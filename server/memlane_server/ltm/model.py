"""Memory items and the value types of recall, as the domain sees them (no proto, no LanceDB).

The kinds, scopes and the draft come from ``memory_kinds`` (shared with extraction) and are re-exported
here so ltm's modules keep one place to import the memory's types from."""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass, field

from ..errors import PermissionDenied
from ..memory_kinds import MemoryDraft, MemoryKind, MemoryScope


class SearchMode(enum.StrEnum):
    """Hybrid is the product; the pure modes exist so the golden set can prove hybrid beats them."""

    HYBRID = "hybrid"
    KEYWORD = "keyword"
    VECTOR = "vector"


class IngestOutcome(enum.StrEnum):
    CREATED = "created"
    MERGED = "merged"  # said the same as an existing item: folded into it
    SUPERSEDED = "superseded"  # created, and retired older items it contradicts
    SKIPPED = "skipped"  # an episode already stored (re-promotion of the same turns)


def new_memory_id(now_ms: int) -> str:
    """Time-sortable id: 12 hex digits of milliseconds, then 16 random hex digits."""
    return f"mem_{now_ms:012x}{secrets.token_hex(8)}"


_HEX = frozenset("0123456789abcdef")


def is_server_id(memory_id: str) -> bool:
    """Whether ``memory_id`` has the shape the server gives ids (``new_memory_id``, and promotion's
    ``mem_<ms><digest>``): a client may not choose one it does not hold (see ``id_unavailable``)."""
    return len(memory_id) == 32 and memory_id.startswith("mem_") and _HEX.issuperset(memory_id[4:])


def id_unavailable(memory_id: str) -> PermissionDenied:
    """The one answer to a write naming a memory id the caller may not claim.

    Ids are unique in the table whoever holds them, and a row is matched by (user, id): so a write
    naming an id that another user holds is refused, and so is a free id of the server's shape
    (``is_server_id``) that a client chose. All of them get these same words, code and reason: the
    answer never tells whether the id is held, nor by whom. (An id outside the server's shape that a
    client guessed exactly is still seen to be unusable: that much is inherent to ids unique across
    users; docs/security.md.)"""
    return PermissionDenied(
        f"memory_id {memory_id!r} is not available to this caller: leave it empty for a server-chosen"
        " id, or choose another",
        field="memory_id",
        reason="MEMORY_ID_UNAVAILABLE",
    )


@dataclass(slots=True)
class MemoryItem:
    """One long-term memory. ``vector`` is omitted (empty) when a read does not need it."""

    id: str
    user_id: str
    agent_id: str
    scope: MemoryScope
    kind: MemoryKind
    content: str
    keywords: list[str] = field(default_factory=list)
    # Single-valued attribute this item states ("location", "units"): a newer item with the same slot
    # and different content supersedes it. Empty for multi-valued facts.
    slot: str = ""
    group: str = ""
    importance: float = 0.5
    usage_count: int = 0
    useful_count: int = 0
    wrong_count: int = 0
    last_used_at_ms: int = 0
    created_at_ms: int = 0
    updated_at_ms: int = 0
    # When the remembered thing happened (an episode's first turn); equals created_at_ms for others.
    occurred_at_ms: int = 0
    source_session_id: str = ""
    source_message_ids: list[str] = field(default_factory=list)
    channel: str = ""
    superseded_by: str = ""
    valid_until_ms: int = 0  # 0 = open-ended; retired items carry the time they stopped being served
    metadata: dict[str, str] = field(default_factory=dict)
    vector: list[float] = field(default_factory=list, repr=False)

    def is_active(self, now_ms: int) -> bool:
        return not self.superseded_by and (self.valid_until_ms == 0 or self.valid_until_ms > now_ms)


@dataclass(slots=True)
class NewMemory(MemoryDraft):
    """A draft with the optional fields CreateMemory can set (extraction's drafts leave them empty)."""

    scope: str = ""  # empty: the kind's default (memory_kinds.DEFAULT_SCOPE)
    group: str = ""
    memory_id: str = ""  # client-chosen id, makes CreateMemory retries idempotent
    valid_until_ms: int = 0


@dataclass(slots=True)
class Owner:
    """Where ingested items belong and where they came from."""

    user_id: str
    agent_id: str = ""
    channel: str = ""
    source_session_id: str = ""


@dataclass(slots=True)
class IngestResult:
    item: MemoryItem
    outcome: IngestOutcome
    superseded_ids: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Visibility:
    """Who is asking. ``user_id`` is mandatory on every read: it is always part of the filter."""

    user_id: str
    agent_id: str = ""
    groups: list[str] = field(default_factory=list)


@dataclass(slots=True)
class MemoryFilter:
    """Optional narrowing on top of visibility. Empty lists / zero times mean "no constraint"."""

    kinds: list[MemoryKind] = field(default_factory=list)
    scopes: list[MemoryScope] = field(default_factory=list)
    channel: str = ""
    # Set: episodic items only from this channel (other kinds from any channel).
    episodes_from_channel: str | None = None
    # Set: no episodic items of this session (its own history holds its turns; other kinds still come).
    episodes_not_from_session: str = ""
    since_ms: int = 0  # occurred_at_ms >= since_ms
    until_ms: int = 0  # occurred_at_ms < until_ms
    # Only the memory viewer may ask for retired items; recall and profile never serve them.
    include_retired: bool = False


@dataclass(slots=True)
class RecallQuery:
    who: Visibility
    text: str
    limit: int = 10
    filter: MemoryFilter = field(default_factory=MemoryFilter)
    mode: SearchMode = SearchMode.HYBRID
    min_score: float = 0.0
    # A caller's query vector (from Embed): the vector retriever uses it instead of embedding ``text``.
    vector: tuple[float, ...] = ()


@dataclass(slots=True)
class ScoreParts:
    """Why an item ranked where it did. Ranks are 1-based; 0 means "not among that retriever's hits"."""

    keyword_rank: int = 0
    keyword_score: float = 0.0  # BM25
    vector_rank: int = 0
    vector_similarity: float = 0.0  # cosine
    fused: float = 0.0  # reciprocal-rank fusion, 1.0 = first in every retriever used
    recency: float = 0.0  # 1.0 = just now, halves every half-life
    usage: float = 0.0  # saturating function of usage_count
    importance: float = 0.0
    final: float = 0.0


@dataclass(slots=True)
class ScoredMemory:
    item: MemoryItem
    score: float
    parts: ScoreParts


@dataclass(slots=True)
class Profile:
    """The capped set assembly injects every turn: instructions, preferences, stable facts."""

    instructions: list[MemoryItem] = field(default_factory=list)
    preferences: list[MemoryItem] = field(default_factory=list)
    facts: list[MemoryItem] = field(default_factory=list)

    def items(self) -> list[MemoryItem]:
        return [*self.instructions, *self.preferences, *self.facts]


@dataclass(slots=True)
class MemoryPatch:
    """UpdateMemory: ``None`` leaves a field unchanged. Changing content re-embeds the item."""

    content: str | None = None
    keywords: list[str] | None = None
    importance: float | None = None
    kind: MemoryKind | None = None
    scope: MemoryScope | None = None
    slot: str | None = None
    metadata: dict[str, str] | None = None
    valid_until_ms: int | None = None


class Feedback(enum.StrEnum):
    USEFUL = "useful"
    WRONG = "wrong"


@dataclass(slots=True)
class MemoryPage:
    items: list[MemoryItem]
    next_page_token: str = ""
    total: int = 0
