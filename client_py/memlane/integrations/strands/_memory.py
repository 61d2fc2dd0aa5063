"""``MemlaneMemoryStore``: a Strands ``MemoryStore`` over memlane's long-term memory, for Strands'
``MemoryManager`` (its ``search_memory`` / ``add_memory`` tools and per-turn injection), plus a
``forget_memory`` tool.

    store = MemlaneMemoryStore("127.0.0.1:50051", user_id="alice", agent_id="support")
    agent = Agent(model=..., plugins=[MemoryManager(stores=[store], add_tool_config=True)])

``search`` is memlane's hybrid recall as the caller (user, agent, groups): it returns exactly the
memories that agent may read. ``add`` stores one memory (screened like every memory: personal data such
as card numbers is refused). Each entry's metadata carries the memory's id, kind, scope and score.
"""

from __future__ import annotations

import asyncio
from typing import Any

from strands import tool
from strands.memory.types import MemoryEntry, MemoryStore, Metadata, SearchOptions
from strands.types.tools import AgentTool

from memlane import AsyncClient, NotFoundError
from memlane.v1 import memory_pb2 as mpb

_DEFAULT_RESULTS = 5


class MemlaneMemoryStore(MemoryStore):
    def __init__(
        self,
        target: str | AsyncClient = "127.0.0.1:50051",
        *,
        user_id: str,
        agent_id: str = "",
        groups: list[str] | None = None,
        name: str = "memlane",
        description: str | None = "Long-term memory of the user: facts, preferences, past events.",
        max_search_results: int | None = _DEFAULT_RESULTS,
        writable: bool = True,
        kind: mpb.MemoryKind.ValueType = mpb.MEMORY_KIND_FACT,
        channel: str = "strands",
        token: str | None = None,
    ) -> None:
        self.name = name
        self.description = description
        self.max_search_results = max_search_results
        self.writable = writable
        self.extraction = None
        self.user_id = user_id
        self.agent_id = agent_id
        self.groups = list(groups or [])
        self.kind = kind
        self.channel = channel
        self._target = target if isinstance(target, str) else ""
        self._token = token
        self._given = target if isinstance(target, AsyncClient) else None
        self._made: dict[asyncio.AbstractEventLoop, AsyncClient] = {}

    @property
    def client(self) -> AsyncClient:
        """The client given, or one per event loop (a synchronous Strands Agent runs a fresh loop per
        invocation)."""
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        if loop not in self._made:
            self._made = {lp: c for lp, c in self._made.items() if not lp.is_closed()}
            self._made[loop] = AsyncClient(self._target, token=self._token, agent_id=self.agent_id or None)
        return self._made[loop]

    def _caller(self) -> mpb.Caller:
        return mpb.Caller(user_id=self.user_id, agent_id=self.agent_id, groups=self.groups)

    async def search(self, query: str, options: SearchOptions | None = None) -> list[MemoryEntry]:
        limit = (options or {}).get("max_search_results") or self.max_search_results or _DEFAULT_RESULTS
        out = await self.client.search_memories(caller=self._caller(), query=query, limit=min(limit, 100))
        return [_entry(hit) for hit in out.results]

    async def add(self, content: str, metadata: Metadata | None = None) -> Any:
        """Stores one memory; returns its id. ``metadata`` values are kept as strings."""
        out = await self.client.create_memory(
            caller=self._caller(),
            kind=self.kind,
            content=content,
            channel=self.channel,
            metadata={str(k): str(v) for k, v in (metadata or {}).items()},
        )
        return out.memory.memory_id

    async def forget(self, memory_id: str) -> bool:
        """Deletes one memory the caller may write; False when there is none of that id."""
        try:
            await self.client.delete_memory(caller=self._caller(), memory_id=memory_id)
        except NotFoundError:
            return False
        return True

    def get_tools(self) -> list[AgentTool]:
        store = self

        @tool(name=f"forget_memory_{self.name}" if self.name != "memlane" else "forget_memory")
        async def forget_memory(memory_id: str) -> str:
            """Forget one long-term memory (for example one the user says is wrong or outdated).

            Args:
                memory_id: The id of the memory, as search_memory returned it (metadata memory_id).
            """
            found = await store.forget(memory_id)
            return f"forgot memory {memory_id}" if found else f"no memory {memory_id}"

        return [forget_memory]

    async def close(self) -> None:
        made = self._made.pop(asyncio.get_running_loop(), None)
        if made is not None:
            await made.close()


def _entry(hit: mpb.ScoredMemory) -> MemoryEntry:
    m = hit.memory
    return MemoryEntry(
        content=m.content,
        metadata={
            "memory_id": m.memory_id,
            "score": round(float(hit.score), 6),
            "kind": mpb.MemoryKind.Name(m.kind),
            "scope": mpb.MemoryScope.Name(m.scope),
            **dict(m.metadata),
        },
    )
