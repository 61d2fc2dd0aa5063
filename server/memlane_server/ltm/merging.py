"""Merging items an operator judged to say one thing (MergeMemories): the first item is kept and takes
every source's provenance, the others are superseded by it, exactly as a contradiction retires an older
item at ingest, so recall, audit, export and erasure treat them alike."""

from __future__ import annotations

from dataclasses import replace

from ..errors import InvalidArgument, NotFound
from ..memory_kinds import MemoryKind
from . import filters
from .history import Change, ChangeReason
from .ingest import SESSIONS_KEY, clamp, clean_keywords, embedding_text, fold_provenance
from .model import MemoryItem, Visibility
from .service import MemoryService, readable
from .slots import canonical_slot

MAX_MERGE = 50  # items one call may fold together: an operator's fix, not a bulk rewrite


class MemoryMerge:
    """Beside ``MemoryService`` (as snapshots are): it writes through the service's store, embedder and
    journal, and announces the change the same way."""

    def __init__(self, memory: MemoryService) -> None:
        self._memory = memory

    async def merge(
        self,
        who: Visibility,
        memory_ids: list[str],
        *,
        content: str = "",
        kind: MemoryKind | None = None,
        slot: str = "",
    ) -> tuple[MemoryItem, list[str]]:
        """Returns the kept item and the ids it superseded. A merge already done (the others superseded by
        the first) returns the kept item without writing again."""
        if not 2 <= len(memory_ids) <= MAX_MERGE:
            raise InvalidArgument(f"memory_ids must name between 2 and {MAX_MERGE} items")
        if len(set(memory_ids)) != len(memory_ids):
            raise InvalidArgument("memory_ids names an item twice")
        m = self._memory
        text = m.check_content(content) if content.strip() else ""
        await m.freshness.current(who.user_id)
        where = readable(who) & filters.with_ids(memory_ids)
        found = {i.id: i for i in await m.store.fetch(where, with_vector=True, limit=len(memory_ids))}
        missing = [m for m in memory_ids if m not in found]
        if missing:
            raise NotFound(f"memory {missing[0]} not found")
        kept, others = found[memory_ids[0]], [found[m] for m in memory_ids[1:]]
        now = m.now_ms()
        if all(o.superseded_by == kept.id for o in others) and not (text or kind or slot):
            return replace(kept, vector=[]), [o.id for o in others]  # a retry of a merge that is done
        retired = [i for i in (kept, *others) if not i.is_active(now) and i.superseded_by != kept.id]
        if retired:
            raise InvalidArgument(f"memory {retired[0].id} is retired (superseded or marked wrong)")
        _fold(kept, [o for o in others if o.superseded_by != kept.id], m.policy.max_source_ids)
        kept.content = text or kept.content
        kept.kind = kind or kept.kind
        kept.slot = canonical_slot(slot) or kept.slot
        kept.updated_at_ms = now
        for o in others:
            o.superseded_by = kept.id
            o.valid_until_ms = now
            o.updated_at_ms = now
        # Rows are written whole (upsert): the others keep their vectors, the kept item's text and
        # keywords may have changed, so it is embedded again.
        kept.vector = (await m.embedder.embed([embedding_text(kept.content, kept.keywords)]))[0].tolist()
        await m.store.upsert([kept, *others])
        if m.history is not None:
            changes = [Change(replace(kept, vector=[]), ChangeReason.MERGE)]
            changes += [Change(replace(o, vector=[]), ChangeReason.SUPERSEDE) for o in others]
            await m.history.record(who.user_id, who.agent_id, changes)
        await m.changed(who.user_id)
        return replace(kept, vector=[]), [o.id for o in others]


def _fold(kept: MemoryItem, others: list[MemoryItem], max_ids: int) -> None:
    """The sources' provenance and standing into the kept item: message ids and sessions accumulate
    (oldest first, as ingest's merge keeps them), keywords join, importance is the highest, the counts
    add up; the earliest time the thing happened stays."""
    for o in others:
        kept.keywords = clean_keywords([*kept.keywords, *o.keywords])
        kept.importance = clamp(max(kept.importance, o.importance))
        kept.usage_count += o.usage_count
        kept.useful_count += o.useful_count
        kept.last_used_at_ms = max(kept.last_used_at_ms, o.last_used_at_ms)
        if o.occurred_at_ms and (not kept.occurred_at_ms or o.occurred_at_ms < kept.occurred_at_ms):
            kept.occurred_at_ms = o.occurred_at_ms
        kept.source_session_id = kept.source_session_id or o.source_session_id
    sessions = [
        s for o in others for s in (*o.metadata.get(SESSIONS_KEY, "").split(","), o.source_session_id)
    ]
    fold_provenance(kept, sessions, [i for o in others for i in o.source_message_ids], max_ids)
