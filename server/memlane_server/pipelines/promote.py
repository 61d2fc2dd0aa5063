"""Promotion: a session's turns become long-term memories, exactly once however often it is re-run.

Each candidate memory gets an id derived from the session, its kind, the messages it came from and its
text (``mem_<occurred ms><digest>``, the shape of ``ltm.new_memory_id`` so ids still sort by time). Before
ingesting, ids already in the store are skipped; ingestion itself folds a re-stated fact into the item it
repeats and skips an episode it already holds. So a crash anywhere in a chunk, followed by a re-run of
that chunk, adds nothing twice.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Protocol

from ..extraction import ExtractedMemory, Extractor, build_episodes
from ..ltm import MemoryService, NewMemory, Owner
from ..ltm.filters import with_ids
from ..sessions.model import Message, Session


class Promoter(Protocol):
    async def promote(self, session: Session, messages: list[Message]) -> list[str]:
        """Promotes ``messages`` (a whole number of exchanges, oldest first); returns the ids of the
        memories they produced or merged into. Idempotent for the same messages."""
        ...


def memory_id_for(session_id: str, draft: ExtractedMemory) -> str:
    key = "\x1f".join([session_id, draft.kind, ",".join(draft.source_message_ids), draft.content.strip()])
    digest = hashlib.blake2b(key.encode(), digest_size=8).hexdigest()
    return f"mem_{max(draft.occurred_at_ms, 0):012x}{digest}"


class LtmPromoter:
    """``Promoter`` over the rule-based (or LLM) extractor, episode builder and ``ltm.MemoryService``."""

    def __init__(self, memory: MemoryService, extractor: Extractor, *, episodes: bool = True) -> None:
        self._memory = memory
        self._extractor = extractor
        self._episodes = episodes

    async def promote(self, session: Session, messages: list[Message]) -> list[str]:
        kept = [m for m in messages if not m.transient]
        if not kept:
            return []
        result = await self._extractor.extract(kept, session)
        drafts = list(result.memories)
        if self._episodes:
            # Keyword extraction and PII redaction over every turn: off the event loop.
            drafts += await asyncio.to_thread(build_episodes, kept, session)
        if not drafts:
            return []
        ids = [memory_id_for(session.session_id, d) for d in drafts]
        existing = {i.id for i in await self._memory.store.fetch(with_ids(ids))}
        fresh = [
            NewMemory(
                kind=d.kind,
                content=d.content,
                keywords=list(d.keywords),
                slot=d.slot,
                importance=d.importance,
                source_message_ids=list(d.source_message_ids),
                occurred_at_ms=d.occurred_at_ms,
                memory_id=mid,
            )
            for d, mid in zip(drafts, ids, strict=True)
            if mid not in existing
        ]
        owner = Owner(session.user_id, session.agent_id, session.channel, session.session_id)
        results = await self._memory.ingest(owner, fresh) if fresh else []
        out = [i for i in ids if i in existing]
        out += [r.item.id for r in results]
        return list(dict.fromkeys(out))
