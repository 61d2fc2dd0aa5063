"""What each viewer page shows, read through the public async client (no HTML here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import memlane
from memlane.v1 import admin_pb2, context_pb2, memory_pb2, session_pb2

PAGE = 200  # rows per list page: a viewer, not an export


def enum_name(enum: Any, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix).lower()
    except ValueError:
        return str(value)


def status_of(s: session_pb2.Session) -> str:
    return enum_name(session_pb2.SessionStatus, s.status, "SESSION_STATUS_")


@dataclass(slots=True)
class InjectedMemory:
    memory_id: str
    score: float
    memory: memory_pb2.Memory | None  # None: deleted since
    parts: memory_pb2.ScoreParts | None = None  # None: a profile item, or a trace older than parts


@dataclass(slots=True)
class TraceBlock:
    block: context_pb2.ContextBlock
    provenance: str
    memories: list[InjectedMemory] = field(default_factory=list)


async def user_sessions(c: memlane.AsyncClient, user_id: str) -> list[session_pb2.Session]:
    return list((await c.list_sessions(user_id=user_id, page_size=PAGE)).sessions)


async def transcript(c: memlane.AsyncClient, session_id: str) -> list[session_pb2.Message]:
    out: list[session_pb2.Message] = []
    token = ""
    while True:  # the whole conversation, oldest first, in pages
        reply = await c.list_messages(session_id=session_id, page_size=1000, page_token=token)
        out.extend(reply.messages)
        token = reply.next_page_token
        if not token or len(out) >= 5000:
            return out


async def traces(c: memlane.AsyncClient, session_id: str) -> list[context_pb2.TurnTrace]:
    return list((await c.list_turn_traces(session_id=session_id, page_size=100)).traces)


async def trace_blocks(
    c: memlane.AsyncClient, user_id: str, trace: context_pb2.TurnTrace
) -> list[TraceBlock]:
    caller = memory_pb2.Caller(user_id=user_id)
    out = []
    for b in trace.blocks:
        tb = TraceBlock(b, enum_name(context_pb2.Provenance, b.provenance, "PROVENANCE_"))
        for ref in b.memories:
            try:
                memory: memory_pb2.Memory | None = (
                    await c.get_memory(caller=caller, memory_id=ref.memory_id)
                ).memory
            except memlane.NotFoundError:
                memory = None
            parts = ref.parts if ref.HasField("parts") else None
            tb.memories.append(InjectedMemory(ref.memory_id, ref.score, memory, parts))
        out.append(tb)
    return out


# ------------------------------------------------------------------------------- the memory manager

USERS_PAGE = 50
MEMORIES_PAGE = 50
_MAX_CALLS = 20  # ListMemories calls one filtered page may make before it offers "more" anyway
_TRACE_SESSIONS = 50  # sessions (newest first) whose traces a memory's page looks through


@dataclass(slots=True)
class UsersPage:
    users: list[admin_pb2.UserSummary]
    next_token: str
    total: int


async def users(c: memlane.AsyncClient, query: str, token: str) -> UsersPage:
    reply = await c.list_users(query=query, page_size=USERS_PAGE, page_token=token)
    return UsersPage(list(reply.users), reply.next_page_token, reply.total_size)


@dataclass(slots=True)
class MemoryQuery:
    """The memories page's filters, as the query string holds them."""

    text: str = ""  # hybrid recall (SearchMemories) when set
    kinds: list[memory_pb2.MemoryKind.ValueType] = field(default_factory=list)
    scopes: list[memory_pb2.MemoryScope.ValueType] = field(default_factory=list)
    agent: str = ""  # written by this agent
    slot: str = ""
    state: str = "active"  # active | retired | all
    since_ms: int = 0
    until_ms: int = 0


@dataclass(slots=True)
class MemoriesPage:
    memories: list[memory_pb2.Memory]
    scores: dict[str, float]  # memory id -> recall score (searches only)
    next_token: str


def _kept(m: memory_pb2.Memory, q: MemoryQuery) -> bool:
    """The filters ListMemories and SearchMemories do not apply themselves."""
    retired = bool(m.superseded_by or m.valid_until_unix_ms)
    state_ok = q.state == "all" or (q.state == "retired") == retired
    return state_ok and (not q.agent or m.agent_id == q.agent) and (not q.slot or m.slot == q.slot)


async def memory_list(c: memlane.AsyncClient, user_id: str, q: MemoryQuery, token: str) -> MemoriesPage:
    caller = memory_pb2.Caller(user_id=user_id)
    flt = memory_pb2.MemoryFilter(
        kinds=q.kinds, scopes=q.scopes, since_unix_ms=q.since_ms, until_unix_ms=q.until_ms
    )
    if q.text:  # the same hybrid recall agents get: active memories only, best first
        hits = (await c.search_memories(caller=caller, query=q.text, limit=100, filter=flt)).results
        kept = [h for h in hits if _kept(h.memory, q)]
        return MemoriesPage([h.memory for h in kept], {h.memory.memory_id: h.score for h in kept}, "")
    flt.include_retired = q.state != "active"
    out: list[memory_pb2.Memory] = []
    for _ in range(_MAX_CALLS):  # whole server pages, so the token of the last one resumes exactly
        reply = await c.list_memories(
            caller=caller, filter=flt, page_size=MEMORIES_PAGE - len(out), page_token=token
        )
        out += [m for m in reply.memories if _kept(m, q)]
        token = reply.next_page_token
        if not token or len(out) >= MEMORIES_PAGE:
            break
    return MemoriesPage(out, {}, token)


@dataclass(slots=True)
class InjectedIn:
    session_id: str
    trace_id: str
    created_at_ms: int
    score: float


@dataclass(slots=True)
class MemoryDetail:
    memory: memory_pb2.Memory
    versions: list[memory_pb2.MemoryVersion]
    replaced: list[memory_pb2.Memory]  # items this one superseded
    source_sessions: list[str]
    injected_in: list[InjectedIn]


async def memory_detail(c: memlane.AsyncClient, user_id: str, memory_id: str) -> MemoryDetail:
    caller = memory_pb2.Caller(user_id=user_id)
    memory = (await c.get_memory(caller=caller, memory_id=memory_id)).memory
    versions = list(
        (await c.list_memory_versions(caller=caller, memory_id=memory_id, page_size=500)).versions
    )
    retired = memory_pb2.MemoryFilter(include_retired=True)
    replaced = [
        m
        for m in await every_memory(c, caller, retired)
        if m.superseded_by == memory_id and m.memory_id != memory_id
    ]
    merged = [s for s in memory.metadata.get("source_sessions", "").split(",") if s]
    sources = list(dict.fromkeys([s for s in (memory.source_session_id, *merged) if s]))
    return MemoryDetail(memory, versions, replaced, sources, await _injected_in(c, user_id, memory_id))


async def every_memory(
    c: memlane.AsyncClient, caller: memory_pb2.Caller, flt: memory_pb2.MemoryFilter
) -> list[memory_pb2.Memory]:
    """Every memory the filter passes (superseded and retired ones too with ``include_retired``)."""
    out: list[memory_pb2.Memory] = []
    token = ""
    while True:
        reply = await c.list_memories(caller=caller, filter=flt, page_size=500, page_token=token)
        out.extend(reply.memories)
        token = reply.next_page_token
        if not token or len(out) >= 5000:
            return out


async def _injected_in(c: memlane.AsyncClient, user_id: str, memory_id: str) -> list[InjectedIn]:
    """The turn traces of the user's newest sessions whose blocks injected the memory."""
    found: list[InjectedIn] = []
    sessions = (await c.list_sessions(user_id=user_id, page_size=_TRACE_SESSIONS)).sessions
    for s in sessions:
        for t in (await c.list_turn_traces(session_id=s.session_id, page_size=100)).traces:
            scores = [ref.score for b in t.blocks for ref in b.memories if ref.memory_id == memory_id]
            if scores:
                found.append(InjectedIn(s.session_id, t.trace_id, t.created_at_unix_ms, max(scores)))
    return sorted(found, key=lambda i: -i.created_at_ms)


async def memories_named(
    c: memlane.AsyncClient, user_id: str, memory_ids: list[str]
) -> list[memory_pb2.Memory]:
    caller = memory_pb2.Caller(user_id=user_id)
    return [(await c.get_memory(caller=caller, memory_id=m)).memory for m in memory_ids]
