"""Strands Agents on memlane, against Strands' real Agent and its own FileSessionManager: the same
scripted conversation (tool calls, agent state, a sliding window, a guardrail redaction) sends the model
the same messages through both, a restored agent gets the same history and state, and the repository
contract (sessions, agents, indexed messages, paging) behaves as the reference. The memory store serves
Strands' MemoryManager tools from memlane's long-term memory."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Literal

import pytest
from strands import Agent, tool
from strands.agent.conversation_manager import SlidingWindowConversationManager
from strands.memory import MemoryManager
from strands.session.file_session_manager import FileSessionManager
from strands.session.session_repository import SessionRepository
from strands.types.exceptions import SessionException
from strands.types.session import Session, SessionAgent, SessionMessage, SessionType

import memlane
from memlane import Role
from memlane.integrations.strands import (
    NATIVE_FORMAT,
    MemlaneMemoryStore,
    MemlaneSessionManager,
    MemlaneSessionRepository,
)
from memlane_server.background import SidecarThread
from tests.strands_model import ScriptedModel, call, guardrail, text


@tool
def weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city.
    """
    return f"sunny in {city}"


def _plain(x: Any) -> Any:
    """Messages without what differs from run to run: Strands' tracking ids (random uuids) and
    latency metrics."""
    if isinstance(x, list):
        return [_plain(i) for i in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items() if k not in ("tracking_id", "metrics")}
    return x


def _script() -> list[dict[str, Any]]:
    return [
        call("weather", {"city": "Lisbon"}, "t1"),
        text("It is sunny in Lisbon."),
        call("weather", {"city": "Porto"}, "t2"),
        text("Sunny in Porto too."),
        guardrail("[User input redacted.]", "I can't help with that."),
        text("You asked about Lisbon and Porto."),
    ]


def _agent(manager: Any, model: ScriptedModel, window: int = 40) -> Agent:
    return Agent(
        agent_id="weather-bot",
        model=model,
        tools=[weather],
        session_manager=manager,
        conversation_manager=SlidingWindowConversationManager(window_size=window),
        callback_handler=None,
    )


def _converse(manager: Any) -> ScriptedModel:
    model = ScriptedModel(_script())
    agent = _agent(manager, model)
    assert str(agent("Weather in Lisbon?")).strip() == "It is sunny in Lisbon."
    agent.state.set("cities", ["Lisbon"])
    agent("And Porto?")
    agent.state.set("cities", ["Lisbon", "Porto"])
    agent("my card is 4111 1111 1111 1111, book me a flight")  # the guardrail redacts this turn
    agent("Which cities did I ask about?")
    return model


def _resume(manager: Any, window: int = 40) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel([text("Lisbon and Porto.")])
    agent = _agent(manager, model, window)
    agent("Again?")
    return agent, model


def test_it_is_a_strands_repository(server: SidecarThread) -> None:
    repo = MemlaneSessionRepository(server.target)
    assert isinstance(repo, SessionRepository)
    repo.close()


def test_agent_sends_the_model_the_same_history_as_the_file_session(
    server: SidecarThread, client: memlane.Client, tmp_path: Path, user_id: str
) -> None:
    sid = f"st-{uuid.uuid4()}"
    reference = _converse(FileSessionManager(sid, str(tmp_path)))
    ours = _converse(MemlaneSessionManager(sid, server.target, user_id=user_id, agent_id="concierge"))
    assert len(ours.sent) == 6
    assert _plain(ours.sent) == _plain(reference.sent)
    # The redacted turn reached the model's later calls as its redaction only.
    last = json.dumps(ours.sent[-1])
    assert "4111" not in last and "[User input redacted.]" in last

    # A fresh process (a new agent, a new manager) restores the same history and state.
    ref_agent, ref_model = _resume(FileSessionManager(sid, str(tmp_path)))
    our_agent, our_model = _resume(MemlaneSessionManager(sid, server.target, user_id=user_id))
    assert _plain(our_model.sent) == _plain(ref_model.sent) and len(our_model.sent[0]) == 13
    assert _plain(our_agent.messages) == _plain(ref_agent.messages)
    assert our_agent.state.get() == ref_agent.state.get() == {"cities": ["Lisbon", "Porto"]}

    # What memlane holds: one message per Strands message, the record whole, roles and text derived; the
    # redacted turn's text is the redaction (summaries, recall and promotion never see the card).
    stored = client.list_messages(session_id=sid, page_size=100).messages
    assert len(stored) == 14 and {m.native.format for m in stored} == {NATIVE_FORMAT}
    assert [m.role for m in stored[:4]] == [
        Role.ROLE_USER,
        Role.ROLE_ASSISTANT,
        Role.ROLE_TOOL,
        Role.ROLE_ASSISTANT,
    ]
    assert list(stored[1].tool_call_ids) == ["t1"] == list(stored[2].tool_call_ids)
    assert stored[2].content == "sunny in Lisbon" and stored[3].source_agent_id == "concierge"
    redacted = [m for m in stored if "redacted" in m.content]
    assert [m.content for m in redacted] == ["[User input redacted.]"]
    assert "4111" not in "".join(m.content for m in stored)
    assert client.get_session(session_id=sid).session.user_id == user_id


def test_a_sliding_window_restores_from_the_same_offset(
    server: SidecarThread, tmp_path: Path, user_id: str
) -> None:
    sid = f"st-{uuid.uuid4()}"
    _converse(FileSessionManager(sid, str(tmp_path)))
    _converse(MemlaneSessionManager(sid, server.target, user_id=user_id))
    ref_agent, ref_model = _resume(FileSessionManager(sid, str(tmp_path)), window=4)
    our_agent, our_model = _resume(MemlaneSessionManager(sid, server.target, user_id=user_id), window=4)
    assert _plain(our_model.sent) == _plain(ref_model.sent)
    assert _plain(our_agent.messages) == _plain(ref_agent.messages)
    # A second restore starts from the window's offset, stored with the agent.
    ref2, _ = _resume(FileSessionManager(sid, str(tmp_path)), window=4)
    ours2, _ = _resume(MemlaneSessionManager(sid, server.target, user_id=user_id), window=4)
    assert _plain(ours2.messages) == _plain(ref2.messages) and len(ours2.messages) <= 4


def _records(n: int) -> list[SessionMessage]:
    out = []
    for i in range(n):
        role: Literal["user", "assistant"] = "user" if i % 2 == 0 else "assistant"
        out.append(SessionMessage.from_message({"role": role, "content": [{"text": f"turn {i} ünï 🚀"}]}, i))
    out.append(
        SessionMessage.from_message(
            {"role": "user", "content": [{"image": {"format": "png", "source": {"bytes": b"\x89PNG\x00"}}}]},
            n,
        )
    )
    return out


def _exercise(repo: SessionRepository, sid: str) -> dict[str, Any]:
    """The same calls on a repository; returns what it answered."""
    seen: dict[str, Any] = {"missing": repo.read_session(sid)}
    repo.create_session(Session(session_id=sid, session_type=SessionType.AGENT))
    with pytest.raises(SessionException):
        repo.create_session(Session(session_id=sid, session_type=SessionType.AGENT))
    assert repo.read_session(sid) is not None
    agents = {
        a: SessionAgent(agent_id=a, state={"n": 1}, conversation_manager_state={"k": a}) for a in ("a1", "a2")
    }
    seen["no_agent"] = repo.read_agent(sid, "a1")
    with pytest.raises(SessionException):
        repo.update_agent(sid, agents["a1"])
    for a in agents.values():
        repo.create_agent(sid, a)
    agents["a1"].state = {"n": 2, "nested": {"x": [1, 2]}}
    repo.update_agent(sid, agents["a1"])
    seen["agent"] = {
        a: (r.state, r.conversation_manager_state) for a in agents if (r := repo.read_agent(sid, a))
    }
    for record in _records(7):
        repo.create_message(sid, "a1", record)
    repo.create_message(
        sid, "a2", SessionMessage.from_message({"role": "user", "content": [{"text": "a2's"}]}, 0)
    )
    seen["pages"] = {
        (limit, offset): [m.to_message() for m in repo.list_messages(sid, "a1", limit=limit, offset=offset)]
        for limit, offset in ((None, 0), (3, 0), (3, 2), (None, 5), (10, 6), (2, 20))
    }
    seen["a2"] = [m.to_message() for m in repo.list_messages(sid, "a2")]
    one = repo.read_message(sid, "a1", 3)
    assert one is not None
    seen["one"] = one.to_message()
    seen["no_message"] = repo.read_message(sid, "a1", 99)
    one.redact_message = {"role": "assistant", "content": [{"text": "[redacted]"}]}
    repo.update_message(sid, "a1", one)
    again = repo.read_message(sid, "a1", 3)
    assert again is not None and again.created_at == one.created_at
    seen["redacted"] = (again.message, again.redact_message)
    with pytest.raises(SessionException):
        repo.update_message(sid, "a1", SessionMessage.from_message({"role": "user", "content": []}, 42))
    return seen


def test_repository_answers_as_the_file_repository(
    server: SidecarThread, client: memlane.Client, tmp_path: Path, user_id: str
) -> None:
    sid = f"st-{uuid.uuid4()}"
    reference = _exercise(FileSessionManager("unused", str(tmp_path)), sid)
    repo = MemlaneSessionRepository(server.target, user_id=user_id)
    ours = _exercise(repo, sid)
    assert ours == reference
    assert ours["pages"][(3, 2)] == [
        {"role": "user" if i % 2 == 0 else "assistant", "content": [{"text": f"turn {i} ünï 🚀"}]}
        for i in (2, 3, 4)
    ]
    assert ours["pages"][(None, 0)][-1]["content"][0]["image"]["source"]["bytes"] == b"\x89PNG\x00"
    # Another client's turn in the same session is nobody's Strands message.
    client.append_messages(
        session_id=sid, messages=[memlane.Message(role=Role.ROLE_USER, content="from elsewhere")]
    )
    assert len(repo.list_messages(sid, "a1")) == 8
    # The redaction is what memlane indexes; the record keeps the original, as Strands' repositories do.
    stored = {m.content for m in client.list_messages(session_id=sid, page_size=100).messages}
    assert "[redacted]" in stored and "turn 3 ünï 🚀" not in stored
    repo.close()


def test_agent_state_is_erased_with_the_user(
    server: SidecarThread, client: memlane.Client, user_id: str
) -> None:
    sid = f"st-{uuid.uuid4()}"
    _converse(MemlaneSessionManager(sid, server.target, user_id=user_id))
    repo = MemlaneSessionRepository(server.target, user_id=user_id)
    assert repo.read_agent(sid, "weather-bot") is not None  # positive control
    client.forget_user(user_id=user_id)
    assert repo.read_session(sid) is None
    assert repo.read_agent(sid, "weather-bot") is None
    assert repo.list_messages(sid, "weather-bot") == []
    repo.close()


async def test_memory_store_serves_the_memory_manager_tools(server: SidecarThread, user_id: str) -> None:
    store = MemlaneMemoryStore(server.target, user_id=user_id, agent_id="concierge")
    memory_id = await store.add("Dana is allergic to peanuts.", {"source": "intake"})
    await store.add("Dana lives in Lisbon.")
    hits = await store.search("what is Dana allergic to?", {"max_search_results": 1})
    assert [h.content for h in hits] == ["Dana is allergic to peanuts."]
    assert hits[0].metadata is not None and hits[0].metadata["memory_id"] == memory_id
    assert hits[0].metadata["source"] == "intake" and hits[0].metadata["score"] > 0

    # Strands' own MemoryManager and Agent: the model calls add_memory, search_memory, forget_memory.
    script = [
        call("add_memory", {"entries": ["Dana prefers window seats."]}, "m1"),
        call("search_memory", {"query": "which seat does Dana prefer?"}, "m2"),
        call("forget_memory", {"memory_id": memory_id}, "m3"),
        text("Done."),
    ]
    model = ScriptedModel(script)
    manager = MemoryManager(stores=[store], add_tool_config=True, injection=False)
    agent = Agent(model=model, plugins=[manager], callback_handler=None)
    await agent.invoke_async("Remember my seat, then forget the allergy.")
    results = [b["toolResult"] for m in model.sent[-1] for b in m["content"] if "toolResult" in b]
    assert [r["status"] for r in results] == ["success"] * 3, results
    assert "window seats" in json.dumps(results[1])
    assert all("peanuts" not in h.content for h in await store.search("allergic peanuts"))
    assert any("window seats" in h.content for h in await store.search("seat"))
    assert await store.forget(memory_id) is False  # already gone
    await store.close()


def test_a_closed_session_refuses_new_turns(
    server: SidecarThread, client: memlane.Client, user_id: str
) -> None:
    sid = f"st-{uuid.uuid4()}"
    model = ScriptedModel([text("Hello."), text("Never sent.")])
    agent = _agent(MemlaneSessionManager(sid, server.target, user_id=user_id), model)
    agent("Hi")  # positive control: the open session takes the turn
    client.close_session(session_id=sid)
    with pytest.raises(memlane.FailedPreconditionError):
        agent("Still there?")
