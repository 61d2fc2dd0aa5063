"""ListMemories and ListTurnTraces pages are bounded in bytes as well as items: heavy items (memories
with full metadata, traces replaying long turns) never make a page the client cannot receive."""

from __future__ import annotations

import memlane
from memlane import Message, Role
from memlane.v1 import memory_pb2 as mpb
from memlane_server.paging import MAX_PAGE_BYTES
from tests.conftest import ServerFactory


def test_memory_pages_stop_at_the_byte_bound(start_server: ServerFactory, user_id: str) -> None:
    srv = start_server()
    heavy = {f"k{i:02d}": f"{i:02d}" + "v" * 1000 for i in range(64)}  # about 64 KiB of metadata
    with memlane.Client(srv.target, timeout=120) as c:
        made = {
            c.create_memory(
                caller=mpb.Caller(user_id=user_id),
                kind=mpb.MEMORY_KIND_FACT,
                content=f"Fact number {i} about the user's garden and its {i} tomato plants.",
                metadata=heavy,
            ).memory.memory_id
            for i in range(80)
        }
        first = c.list_memories(caller=mpb.Caller(user_id=user_id), page_size=500)
        # 80 items of about 65 KiB do not fit one page: it stops under the bound and says where to go on.
        assert 0 < len(first.memories) < 80 and first.next_page_token
        assert first.ByteSize() <= MAX_PAGE_BYTES + 128 * 1024
        pages = list(
            memlane.iter_pages(
                lambda t: c.list_memories(caller=mpb.Caller(user_id=user_id), page_size=500, page_token=t),
                "memories",
            )
        )
        assert sorted(m.memory_id for m in pages) == sorted(made)  # every item once, none twice


def test_trace_pages_stop_at_the_byte_bound(start_server: ServerFactory, user_id: str) -> None:
    srv = start_server(ltm_enabled=False)
    big = "word " * 40_000  # about 200 KB of text, about 40k tokens
    with memlane.Client(srv.target, timeout=120) as c:
        sid = c.create_session(user_id=user_id).session.session_id
        c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content=big)])
        for i in range(30):  # each trace replays the 200 KB turn: 30 of them pass 4 MiB
            list(
                c.assemble_context(session_id=sid, user_input=f"question {i}", context_window_tokens=200_000)
            )
        first = c.list_turn_traces(session_id=sid, page_size=100)
        assert 0 < len(first.traces) < 30 and first.next_page_token
        assert first.ByteSize() <= MAX_PAGE_BYTES + 512 * 1024
        ids = [
            t.trace_id
            for t in memlane.iter_pages(
                lambda tok: c.list_turn_traces(session_id=sid, page_size=100, page_token=tok), "traces"
            )
        ]
        assert len(ids) == len(set(ids)) == 30
