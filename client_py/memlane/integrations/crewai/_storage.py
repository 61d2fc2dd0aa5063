"""``MemlaneStorage``: CrewAI's memory ``StorageBackend`` on memlane's long-term memory.

    memory = Memory(storage=MemlaneStorage(target, user_id="alice", agent_id="crew"),
                    embedder=MemlaneEmbedder(target), llm=...)

Each CrewAI record is one memlane memory of the storage's caller (user, agent, groups), channel
``crewai``, kind episodic (so memlane never merges two records), its id ``crewai-<record id>``: the
content is the memory's content (memlane embeds and indexes it: keyword and vector recall), the
importance its importance, ``created_at`` its ``occurred_at``; the record itself (scope path,
categories, metadata, source, private flag, times) is kept whole in the memory's metadata. CrewAI's
``search`` passes only a query vector: it goes to ``SearchMemories.query_vector`` (the vector must come
from ``MemlaneEmbedder``, the model memlane indexes with), and the score is the reference storage's
(``1 / (1 + squared L2 distance)`` of the normalized vectors). Scope prefixes, categories and metadata
filters are applied here, on what the caller may read.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from typing import Any

from crewai.memory.types import MemoryRecord, ScopeInfo
from google.protobuf.field_mask_pb2 import FieldMask

from memlane import Client, NotFoundError
from memlane.v1 import memory_pb2 as mpb

CHANNEL = "crewai"
RECORD_KEY = "crewai.record"
_PAGE = 500  # ListMemories' largest page
_SEARCH_MAX = 100  # SearchMemories' largest limit
_UPDATED = FieldMask(paths=["content", "importance", "metadata"])


class MemlaneStorage:
    def __init__(
        self,
        target: str | Client = "127.0.0.1:50051",
        *,
        user_id: str,
        agent_id: str = "",
        groups: list[str] | None = None,
        token: str | None = None,
    ) -> None:
        self.client = (
            target if isinstance(target, Client) else Client(target, token=token, agent_id=agent_id or None)
        )
        self._owns_client = not isinstance(target, Client)
        self.caller = mpb.Caller(user_id=user_id, agent_id=agent_id, groups=list(groups or []))

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    # --------------------------------------------------------------------------------- writes

    def save(self, records: list[MemoryRecord]) -> None:
        for r in records:
            self.client.create_memory(
                caller=self.caller,
                memory_id=_memory_id(r.id),
                kind=mpb.MEMORY_KIND_EPISODIC,
                content=r.content,
                importance=r.importance,
                channel=CHANNEL,
                occurred_at_unix_ms=_ms(r.created_at),
                metadata={RECORD_KEY: r.model_dump_json()},
            )

    def update(self, record: MemoryRecord) -> None:
        """Replaces the record of the same id (its ``created_at`` kept, as the reference storage does)."""
        previous = self.get_record(record.id)
        if previous is not None:
            record = record.model_copy(update={"created_at": previous.created_at})
        memory = mpb.Memory(
            memory_id=_memory_id(record.id),
            content=record.content,
            importance=record.importance,
            metadata={RECORD_KEY: record.model_dump_json()},
        )
        self.client.update_memory(caller=self.caller, memory=memory, update_mask=_UPDATED)

    def delete(
        self,
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        record_ids: list[str] | None = None,
        older_than: datetime | None = None,
        metadata_filter: dict[str, Any] | None = None,
    ) -> int:
        ids = set(record_ids or [])
        doomed = [
            r
            for r in self._records()
            if (not ids or r.id in ids)
            and _in_scope(r, scope_prefix)
            and _matches(r, categories, metadata_filter)
            and (older_than is None or r.created_at < older_than)
        ]
        return sum(self._forget(r.id) for r in doomed)

    def reset(self, scope_prefix: str | None = None) -> None:
        """CrewAI's ``reset_memories``: deletes the caller's CrewAI records (in the scope), nothing else
        of the user."""
        self.delete(scope_prefix=scope_prefix)

    def _forget(self, record_id: str) -> bool:
        try:
            self.client.delete_memory(caller=self.caller, memory_id=_memory_id(record_id))
        except NotFoundError:
            return False
        return True

    # ---------------------------------------------------------------------------------- reads

    def search(  # noqa: PLR0917 - CrewAI's StorageBackend signature
        self,
        query_embedding: list[float],
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        metadata_filter: dict[str, Any] | None = None,
        limit: int = 10,
        min_score: float = 0.0,
    ) -> list[tuple[MemoryRecord, float]]:
        # memlane ranks by its final score (recency, usage, importance too); CrewAI wants the nearest
        # vectors and weighs them itself: take memlane's widest vector candidate set, order it here.
        reply = self.client.search_memories(
            caller=self.caller,
            query_vector=query_embedding,
            limit=_SEARCH_MAX,
            filter=mpb.MemoryFilter(channel=CHANNEL),
            mode=mpb.SEARCH_MODE_VECTOR,
        )
        out: list[tuple[MemoryRecord, float]] = []
        for hit in sorted(reply.results, key=lambda h: -h.parts.vector_similarity):
            record = _record(hit.memory)
            if (
                record is None
                or not _in_scope(record, scope_prefix)
                or not _matches(record, categories, metadata_filter)
            ):
                continue
            score = 1.0 / (1.0 + (2.0 - 2.0 * float(hit.parts.vector_similarity)))
            if score >= min_score:
                out.append((record, score))
        return out[:limit]

    def get_record(self, record_id: str) -> MemoryRecord | None:
        try:
            memory = self.client.get_memory(caller=self.caller, memory_id=_memory_id(record_id)).memory
        except NotFoundError:
            return None
        return _record(memory)

    def list_records(
        self, scope_prefix: str | None = None, limit: int = 200, offset: int = 0
    ) -> list[MemoryRecord]:
        if limit <= 0 or offset < 0:
            return []
        records = sorted(
            (r for r in self._records() if _in_scope(r, scope_prefix)),
            key=lambda r: r.created_at,
            reverse=True,
        )
        return records[offset : offset + limit]

    def get_scope_info(self, scope: str) -> ScopeInfo:
        path = scope.rstrip("/") or "/"
        rows = [r for r in self._records() if _in_scope(r, path)]
        child_prefix = "/" if path == "/" else path + "/"
        children = {
            child_prefix + r.scope[len(child_prefix) :].split("/", 1)[0]
            for r in rows
            if r.scope.startswith(child_prefix)
        }
        return ScopeInfo(
            path=path,
            record_count=len(rows),
            categories=sorted({c for r in rows for c in r.categories}),
            oldest_record=min((r.created_at for r in rows), default=None),
            newest_record=max((r.created_at for r in rows), default=None),
            child_scopes=sorted(c for c in children if c != child_prefix),
        )

    def list_scopes(self, parent: str = "/") -> list[str]:
        prefix = (parent.rstrip("/") or "") + "/"
        own = prefix.rstrip("/") or "/"
        children = {
            prefix + r.scope[len(prefix) :].split("/", 1)[0]
            for r in self._records()
            if r.scope.startswith(prefix) and r.scope != own
        }
        return sorted(c for c in children if c != prefix)

    def list_categories(self, scope_prefix: str | None = None) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self._records():
            if _in_scope(r, scope_prefix):
                for c in r.categories:
                    counts[c] = counts.get(c, 0) + 1
        return counts

    def count(self, scope_prefix: str | None = None) -> int:
        return sum(1 for r in self._records() if _in_scope(r, scope_prefix))

    def _records(self) -> list[MemoryRecord]:
        out: list[MemoryRecord] = []
        token = ""
        while True:
            page = self.client.list_memories(
                caller=self.caller,
                filter=mpb.MemoryFilter(channel=CHANNEL),
                page_size=_PAGE,
                page_token=token,
            )
            out.extend(r for m in page.memories if (r := _record(m)) is not None)
            token = page.next_page_token
            if not token:
                return out

    # ---------------------------------------------------------------------------------- async

    async def asave(self, records: list[MemoryRecord]) -> None:
        await asyncio.to_thread(self.save, records)

    async def asearch(  # noqa: PLR0917 - CrewAI's StorageBackend signature
        self,
        query_embedding: list[float],
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        metadata_filter: dict[str, Any] | None = None,
        limit: int = 10,
        min_score: float = 0.0,
    ) -> list[tuple[MemoryRecord, float]]:
        return await asyncio.to_thread(
            self.search, query_embedding, scope_prefix, categories, metadata_filter, limit, min_score
        )

    async def adelete(
        self,
        scope_prefix: str | None = None,
        categories: list[str] | None = None,
        record_ids: list[str] | None = None,
        older_than: datetime | None = None,
        metadata_filter: dict[str, Any] | None = None,
    ) -> int:
        return await asyncio.to_thread(
            self.delete, scope_prefix, categories, record_ids, older_than, metadata_filter
        )


def _memory_id(record_id: str) -> str:
    return f"crewai-{record_id}"


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _record(m: mpb.Memory) -> MemoryRecord | None:
    raw = m.metadata.get(RECORD_KEY)
    if not raw:
        return None
    record = MemoryRecord.model_validate(json.loads(raw))
    return record.model_copy(update={"content": m.content, "importance": m.importance})


def _in_scope(r: MemoryRecord, scope_prefix: str | None) -> bool:
    """The reference storage's rule: a prefix ``/a`` matches ``/a``, ``/a/b`` (and ``/ab``: it is a plain
    string prefix there too); none, ``""`` or ``/`` matches everything."""
    if scope_prefix is None or not scope_prefix.strip("/"):
        return True
    prefix = scope_prefix.rstrip("/")
    if not prefix.startswith("/"):
        prefix = "/" + prefix
    return str(r.scope).startswith(prefix)


def _matches(r: MemoryRecord, categories: list[str] | None, metadata_filter: dict[str, Any] | None) -> bool:
    if categories and not any(c in r.categories for c in categories):
        return False
    return not metadata_filter or all(r.metadata.get(k) == v for k, v in metadata_filter.items())
