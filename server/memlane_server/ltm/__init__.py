"""Long-term memory: items in LanceDB, hybrid recall, merge/supersede, caps, usage and pruning.

In-process API (what assembly, the session-end pipeline and the gRPC servicer call) — one
``MemoryService`` built by ``app.py``::

    store = await LanceMemoryStore.open(uri, embedder.ndims)      # directory or s3:// URI
    memory = MemoryService(store, embedder, memory_tuning(settings.ltm), guard=pii_kinds)  # wiring/stores.py

    # Recall: hybrid (BM25 + vector, RRF-fused, re-ranked by recency/usage/importance).
    hits: list[ScoredMemory] = await memory.search(
        RecallQuery(who=Visibility(user_id, agent_id, groups), text="where does the user live", limit=5)
    )   # hit.item: MemoryItem, hit.score: float, hit.parts: ScoreParts (why it ranked)

    # The capped block injected every turn (instructions, preferences, stable facts).
    profile: Profile = await memory.profile(Visibility(user_id, agent_id))

    # After assembling a context: count a use of every injected item. Returns at once; batched writes.
    await memory.bump_usage([item.id for item in injected])

    # Promotion (session end) / ExtractMemories: drafts are extraction's output or ``NewMemory``.
    results: list[IngestResult] = await memory.ingest(Owner(user_id, agent_id, channel, session_id), drafts)

CRUD for the memory viewer: ``create``, ``get``, ``list_items`` (keyset pages), ``update``, ``delete``;
``feedback(who, id, Feedback.USEFUL | Feedback.WRONG)``; upkeep: ``prune()``, ``MemoryMaintenance``.

Every read is filtered by the user (``filters.visible_to``, on the digest column ``user_key``: no caller
string ever reaches a LanceDB predicate, see ``filters``); retired items (superseded, marked
wrong, past ``valid_until``) are kept for audit but never returned by ``search`` or ``profile``.
"""

from ..memory_kinds import MemoryDraft, MemoryKind, MemoryScope, default_scope
from .core import ContentGuard
from .model import (
    Feedback,
    IngestOutcome,
    IngestResult,
    MemoryFilter,
    MemoryItem,
    MemoryPage,
    MemoryPatch,
    NewMemory,
    Owner,
    Profile,
    RecallQuery,
    ScoredMemory,
    ScoreParts,
    SearchMode,
    Visibility,
)
from .operations import MemoryMaintenance
from .service import MemoryService
from .store import LanceMemoryStore
from .tuning import MemoryTuning
from .upkeep import PruneReport

__all__ = [
    "ContentGuard",
    "Feedback",
    "IngestOutcome",
    "IngestResult",
    "LanceMemoryStore",
    "MemoryDraft",
    "MemoryFilter",
    "MemoryItem",
    "MemoryKind",
    "MemoryMaintenance",
    "MemoryPage",
    "MemoryPatch",
    "MemoryScope",
    "MemoryService",
    "MemoryTuning",
    "NewMemory",
    "Owner",
    "Profile",
    "PruneReport",
    "RecallQuery",
    "ScoreParts",
    "ScoredMemory",
    "SearchMode",
    "Visibility",
    "default_scope",
]
