"""What each viewer page shows, read through the public async client (no HTML here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import memlane
from memlane.v1 import context_pb2, memory_pb2, session_pb2

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


async def memories(c: memlane.AsyncClient, user_id: str) -> list[memory_pb2.Memory]:
    """Every memory of the user, superseded and retired ones included (the supersede chain)."""
    caller = memory_pb2.Caller(user_id=user_id)
    audit = memory_pb2.MemoryFilter(include_retired=True)
    out: list[memory_pb2.Memory] = []
    token = ""
    while True:
        reply = await c.list_memories(caller=caller, filter=audit, page_size=500, page_token=token)
        out.extend(reply.memories)
        token = reply.next_page_token
        if not token or len(out) >= 5000:
            return out
