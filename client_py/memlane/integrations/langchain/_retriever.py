"""``MemlaneRetriever``: LangChain's ``BaseRetriever`` over memlane's long-term memory.

    retriever = MemlaneRetriever(target="127.0.0.1:50051", user_id="alice", k=5)
    docs = retriever.invoke("Where does Alice live?")

A query is ``SearchMemories`` (hybrid recall: BM25 + vectors, then recency, usage and importance) with
the caller ``(user_id, agent_id, groups)``: the retriever sees exactly the memories that agent may
read. Each document is one memory; its metadata carries the final score and every score part.
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, PrivateAttr

from memlane import AsyncClient, Client
from memlane.v1 import memory_pb2 as mpb


def to_document(hit: mpb.ScoredMemory) -> Document:
    m = hit.memory
    metadata: dict[str, Any] = {
        "memory_id": m.memory_id,
        "score": hit.score,
        "score_parts": {f.name: getattr(hit.parts, f.name) for f in hit.parts.DESCRIPTOR.fields},
        "kind": mpb.MemoryKind.Name(m.kind),
        "scope": mpb.MemoryScope.Name(m.scope),
        "user_id": m.user_id,
        "agent_id": m.agent_id,
        "group": m.group,
        "channel": m.channel,
        "keywords": list(m.keywords),
        "importance": m.importance,
        "created_at_unix_ms": m.created_at_unix_ms,
        "updated_at_unix_ms": m.updated_at_unix_ms,
        "occurred_at_unix_ms": m.occurred_at_unix_ms,
        "source_session_id": m.source_session_id,
        "source_message_ids": list(m.source_message_ids),
        "metadata": dict(m.metadata),
    }
    return Document(page_content=m.content, metadata=metadata, id=m.memory_id)


class MemlaneRetriever(BaseRetriever):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    target: str = "127.0.0.1:50051"
    """The sidecar's address (ignored when ``client`` / ``aclient`` are given)."""
    user_id: str
    agent_id: str = ""
    groups: list[str] = Field(default_factory=list)
    k: int = 4
    """How many memories (1..100)."""
    kinds: list[int] = Field(default_factory=list)
    """Only these ``MemoryKind`` values (empty: all)."""
    min_score: float = 0.0
    token: str | None = None
    client: Client | None = None
    aclient: AsyncClient | None = None
    _made: dict[Any, Any] = PrivateAttr(default_factory=dict)

    def _request(self, query: str) -> mpb.SearchMemoriesRequest:
        return mpb.SearchMemoriesRequest(
            caller=mpb.Caller(user_id=self.user_id, agent_id=self.agent_id, groups=self.groups),
            query=query,
            limit=self.k,
            filter=mpb.MemoryFilter(kinds=self.kinds),  # type: ignore[arg-type]
            min_score=self.min_score,
        )

    def _sync_client(self) -> Client:
        if self.client is None:
            self.client = Client(self.target, token=self.token, agent_id=self.agent_id or None)
        return self.client

    def _async_client(self) -> AsyncClient:
        if self.aclient is not None:
            return self.aclient
        loop = asyncio.get_running_loop()
        if loop not in self._made:
            self._made[loop] = AsyncClient(self.target, token=self.token, agent_id=self.agent_id or None)
        made: AsyncClient = self._made[loop]
        return made

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return [to_document(h) for h in self._sync_client().search_memories(self._request(query)).results]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        resp = await self._async_client().search_memories(self._request(query))
        return [to_document(h) for h in resp.results]
