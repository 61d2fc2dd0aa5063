"""The high-level client (``memlane.Memlane`` / ``AsyncMemlane``) against a real sidecar: sessions created
on first use, the assembled context as OpenAI chat messages, remember / search, forget a user."""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

import pytest

import memlane
from memlane import AsyncMemlane, Memlane, MemoryKind
from memlane_server.background import SidecarThread

TOOL_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "refund", "arguments": "{}"}}],
}


def test_the_common_path(server: SidecarThread) -> None:
    user, sid = f"u-{uuid.uuid4().hex[:8]}", f"chat-{uuid.uuid4().hex[:8]}"
    with Memlane(server.target, agent_id="support-bot", channel="web") as m:
        first = m.add(user, sid, [{"role": "user", "content": "My order 4417 arrived damaged."}])
        assert [r.seq for r in first] == [1] and first[0].token_count > 0
        session = m.client.get_session(session_id=sid).session  # created on first use, for this user
        assert (session.user_id, session.agent_id, session.channel) == (user, "support-bot", "web")
        more = m.add(
            user,
            sid,
            [
                TOOL_CALL,
                {"role": "tool", "tool_call_id": "call_1", "content": "refund queued"},
                {"role": "assistant", "content": [{"type": "text", "text": "Refund on its way."}]},
            ],
        )
        assert [r.seq for r in more] == [2, 3, 4]

        memory_id = m.remember(
            user, "Prefers email over phone calls.", kind=MemoryKind.MEMORY_KIND_PREFERENCE
        )
        hits = m.search(user, "how should we contact the customer?")
        assert [h.memory.memory_id for h in hits][:1] == [memory_id]
        assert hits[0].parts is not None

        question = "how should we contact them about order 4417?"
        chat = m.context(sid, question, system_prompt="Be brief.")
        assert chat[0] == {"role": "system", "content": "Be brief."}
        # The new question comes last, ready to send; before it, the conversation exactly as it was added
        # (tool calls and content parts included).
        assert chat[-1] == {"role": "user", "content": question}
        tail = chat[-5:-1]
        assert tail[0] == {"role": "user", "content": "My order 4417 arrived damaged."}
        assert tail[1] == TOOL_CALL
        assert tail[2] == {"role": "tool", "tool_call_id": "call_1", "content": "refund queued"}
        assert tail[3]["content"] == [{"type": "text", "text": "Refund on its way."}]
        # Recalled memories arrive as system messages before the conversation.
        assert any(c["role"] == "system" and "Prefers email" in str(c.get("content")) for c in chat[1:-5])

        # Erasure needs the admin role, which an agent named by its header does not hold.
        with pytest.raises(memlane.PermissionDeniedError, match="admin"):
            m.forget_user(user)
        with Memlane(server.target) as operator:  # auth off: the development caller
            erased = operator.forget_user(user)
        assert erased and sum(erased.values()) > 0
        assert m.search(user, "how should we contact the customer?") == []
        # The session went with the user: add() starts it again.
        assert [r.seq for r in m.add(user, sid, [{"role": "user", "content": "Hello again."}])] == [1]

        with pytest.raises(memlane.InvalidArgumentError, match="role 'robot'"):
            m.add(user, sid, [{"role": "robot", "content": "beep"}])


async def test_the_async_common_path(server: SidecarThread) -> None:
    user, sid = f"u-{uuid.uuid4().hex[:8]}", f"chat-{uuid.uuid4().hex[:8]}"
    async with AsyncMemlane(server.target, agent_id="support-bot") as m:
        added = await m.add(
            user,
            sid,
            [
                {"role": "user", "content": "I live in Porto."},
                {"role": "assistant", "content": "Noted."},
            ],
        )
        assert [r.seq for r in added] == [1, 2]
        memory_id = await m.remember(user, "Lives in Porto.")
        assert [h.memory.memory_id for h in await m.search(user, "where does the user live?")][:1] == [
            memory_id
        ]
        chat = await m.context(sid, "where do I live?")
        assert chat[-3:] == [
            {"role": "user", "content": "I live in Porto."},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "where do I live?"},
        ]
        async with AsyncMemlane(server.target) as operator:
            assert sum((await operator.forget_user(user)).values()) > 0
        assert await m.search(user, "where does the user live?") == []


def test_the_readme_quick_start_runs(server: SidecarThread, capsys: pytest.CaptureFixture[str]) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Quick start (Python client)", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    assert '"127.0.0.1:50051"' in code
    exec(compile(code.replace('"127.0.0.1:50051"', repr(server.target)), "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "Prefers email over phone calls." in out  # search found it
    assert "'role': 'user', 'content': 'My order 4417 arrived damaged.'" in out  # the turns
    # ... and last, the new question, as the README says.
    assert out.rstrip().endswith("{'role': 'user', 'content': 'where is my replacement?'}]")


def test_the_high_level_clients_speak_as_their_agent(server: SidecarThread) -> None:
    """With auth off, a call without an agent id is the unrestricted development caller; Memlane and
    AsyncMemlane send theirs on every call, so agent B does not read agent A's private turns."""
    user, sid = f"u-{uuid.uuid4().hex[:8]}", f"chat-{uuid.uuid4().hex[:8]}"
    with memlane.Client(server.target, agent_id="agent-a") as a:
        a.create_session(session_id=sid, user_id=user, topology=memlane.Topology.TOPOLOGY_DISTRIBUTED)
        a.append_messages(
            session_id=sid,
            messages=[memlane.Message(role=memlane.Role.ROLE_ASSISTANT, content="A's private plan")],
        )

    def said(chat: list[memlane.ChatMessage]) -> list[object]:
        return [m["content"] for m in chat if m["role"] != "system"]

    with Memlane(server.target, agent_id="agent-b") as b:
        assert "A's private plan" not in str(said(b.context(sid)))
        assert b.client.list_messages(session_id=sid).messages == []

    async def async_view() -> list[memlane.ChatMessage]:
        async with AsyncMemlane(server.target, agent_id="agent-b") as ab:
            return await ab.context(sid)

    assert "A's private plan" not in str(said(asyncio.run(async_view())))
    # Positive controls: the writer reads its own turn, and so does a caller that names no agent
    # (auth off: the development caller), as the README says.
    with Memlane(server.target, agent_id="agent-a") as a2:
        assert "A's private plan" in str(said(a2.context(sid)))
    with Memlane(server.target) as anyone:
        assert "A's private plan" in str(said(anyone.context(sid)))


def test_context_ends_with_the_question_once_unless_left_out(server: SidecarThread) -> None:
    user, sid = f"u-{uuid.uuid4().hex[:8]}", f"chat-{uuid.uuid4().hex[:8]}"
    turns: list[memlane.ChatMessage] = [
        {"role": "user", "content": "My parcel is late."},
        {"role": "assistant", "content": "Let me check."},
    ]
    ask = {"role": "user", "content": "any news?"}
    with Memlane(server.target, agent_id="support-bot") as m:
        m.add(user, sid, turns)
        assert m.context(sid, "any news?")[-3:] == [*turns, ask]
        # Left out on request: the window ends with the stored turns, as before.
        assert m.context(sid, "any news?", include_input=False)[-2:] == turns
        assert m.context(sid)[-2:] == turns  # no question, nothing added
        # Nothing stored by context(): the session still holds the two turns.
        assert m.client.get_session(session_id=sid).session.message_count == 2
        # Added first (the old advice): the question is there once, as the last turn.
        m.add(user, sid, [ask])
        chat = m.context(sid, "any news?")
        assert chat[-3:] == [*turns, ask]
        assert sum(1 for c in chat if c == ask) == 1

    async def async_windows() -> tuple[list[memlane.ChatMessage], list[memlane.ChatMessage]]:
        async with AsyncMemlane(server.target, agent_id="support-bot") as am:
            return await am.context(sid, "and now?"), await am.context(sid, "and now?", include_input=False)

    with_it, without = asyncio.run(async_windows())
    assert with_it[-2:] == [ask, {"role": "user", "content": "and now?"}]
    assert without[-1] == ask
