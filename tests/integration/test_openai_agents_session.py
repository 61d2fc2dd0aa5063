"""``MemlaneSession`` against the OpenAI Agents SDK's real ``Runner`` and its own ``SQLiteSession``:
the same scripted conversation (tool calls included) sends the model the same history through both,
items round-trip exactly, and pop / clear / limit behave as the SDK's reference session."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from agents import Agent, Runner, function_tool, set_tracing_disabled
from agents.memory import Session, SessionSettings, SQLiteSession

import memlane
from memlane import Role
from memlane.integrations.openai_agents import NATIVE_FORMAT, MemlaneSession
from memlane_server.background import SidecarThread
from tests.agents_model import ScriptedModel, call, text

set_tracing_disabled(True)  # the SDK's tracing would try to export to OpenAI's servers

ITEMS: list[Any] = [
    {"role": "user", "content": 'Hi, I\'m Dana. Ünïcode 🚀 and "quotes" \\ too'},
    {
        "role": "user",
        "content": [{"type": "input_text", "text": "part one"}, {"type": "input_text", "text": "two"}],
    },
    {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "lookup", "arguments": '{"q": "x"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "result 1"},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "thinking"}]},
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Done.", "annotations": [], "logprobs": []}],
    },
    {"role": "system", "content": "be brief"},
    {"role": "developer", "content": "dev note"},
    {
        "type": "web_search_call",
        "id": "ws_1",
        "status": "completed",
        "action": {"type": "search", "query": "q"},
    },
    {"role": "user", "content": "the same text twice"},
    {"role": "user", "content": "the same text twice"},
]


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def _script() -> list[Any]:
    return [
        [call("weather", '{"city": "Lisbon"}', "c1")],
        [text("It is sunny in Lisbon.", "m1")],
        [call("weather", '{"city": "Porto"}', "c2"), call("weather", '{"city": "Faro"}', "c3")],
        [text("Sunny in both.", "m2")],
        [text("You asked about Lisbon, Porto and Faro.", "m3")],
    ]


async def _converse(session: Any) -> ScriptedModel:
    model = ScriptedModel(_script())
    agent = Agent(name="weather", instructions="Answer about the weather.", model=model, tools=[weather])
    assert (await Runner.run(agent, "Weather in Lisbon?", session=session)).final_output == (
        "It is sunny in Lisbon."
    )
    assert (await Runner.run(agent, "And Porto and Faro?", session=session)).final_output == "Sunny in both."
    out = await Runner.run(agent, "Which cities did I ask about?", session=session)
    assert out.final_output == "You asked about Lisbon, Porto and Faro."
    return model


def test_it_is_an_sdk_session(server: SidecarThread) -> None:
    assert isinstance(MemlaneSession("s", server.target), Session)


async def test_runner_sends_the_model_the_same_history_as_the_sdk_session(
    server: SidecarThread, client: memlane.Client, tmp_path: Any
) -> None:
    reference = await _converse(SQLiteSession("ref", str(tmp_path / "ref.db")))
    sid = f"oa-{uuid.uuid4()}"
    session = MemlaneSession(sid, server.target, user_id="dana", agent_id="weather-bot")
    ours = await _converse(session)
    assert len(ours.sent) == 5
    assert [s.input for s in ours.sent] == [s.input for s in reference.sent]
    # The last call saw the whole conversation: three user turns, three tool calls and their outputs.
    last = ours.sent[-1].input
    assert [i.get("type", "message") for i in last].count("function_call_output") == 3
    assert last[-1] == {"role": "user", "content": "Which cities did I ask about?"}
    history = await session.get_items()
    assert history == await SQLiteSession("ref", str(tmp_path / "ref.db")).get_items()

    # What memlane holds: one message per item, roles and tool call ids derived, the item kept whole.
    stored = client.list_messages(session_id=sid, page_size=100).messages
    assert [json.loads(m.native.json) for m in stored] == history
    assert {m.native.format for m in stored} == {NATIVE_FORMAT}
    assert [m.role for m in stored[:4]] == [
        Role.ROLE_USER,
        Role.ROLE_ASSISTANT,
        Role.ROLE_TOOL,
        Role.ROLE_ASSISTANT,
    ]
    assert list(stored[1].tool_call_ids) == ["c1"] and list(stored[2].tool_call_ids) == ["c1"]
    assert stored[2].content == "sunny in Lisbon" and stored[3].content == "It is sunny in Lisbon."
    assert stored[3].source_agent_id == "weather-bot"
    assert client.get_session(session_id=sid).session.user_id == "dana"
    await session.close()


async def test_items_round_trip_exactly_with_limits(server: SidecarThread) -> None:
    session = MemlaneSession(f"oa-{uuid.uuid4()}", server.target)
    assert await session.get_items() == []  # not created yet: the empty history
    await session.add_items(ITEMS[:5])
    await session.add_items(ITEMS[5:])
    assert await session.get_items() == ITEMS
    assert await session.get_items(limit=3) == ITEMS[-3:]
    assert await session.get_items(limit=1) == ITEMS[-1:]
    assert await session.get_items(limit=100) == ITEMS
    assert await session.get_items(limit=0) == []
    assert await session.get_items(limit=-1) == ITEMS  # SQLiteSession's reading of a negative limit
    limited = MemlaneSession(session.session_id, server.target, session_settings=SessionSettings(limit=2))
    assert await limited.get_items() == ITEMS[-2:]
    assert await limited.get_items(limit=4) == ITEMS[-4:]  # an explicit limit wins
    await session.close()
    await limited.close()


async def test_pop_and_clear(server: SidecarThread, client: memlane.Client) -> None:
    session = MemlaneSession(f"oa-{uuid.uuid4()}", server.target)
    assert await session.pop_item() is None  # unknown session
    await session.clear_session()  # unknown session: nothing to do, no error
    await session.add_items(ITEMS[:4])
    assert await session.pop_item() == ITEMS[3]
    assert await session.pop_item() == ITEMS[2]
    assert await session.get_items() == ITEMS[:2]
    assert client.get_session(session_id=session.session_id).session.message_count == 2
    await session.add_items(ITEMS[2:4])
    assert await session.get_items() == ITEMS[:4]
    await session.clear_session()
    assert await session.get_items() == []
    assert await session.pop_item() is None
    await session.add_items(ITEMS[:1])  # the session goes on after a clear
    assert await session.get_items() == ITEMS[:1]
    await session.close()


async def test_other_writers_turns_read_as_plain_messages(
    server: SidecarThread, client: memlane.Client
) -> None:
    """A turn written by another client (Memlane.add, another framework) is read as an easy input
    message; tool traffic in another framework's format has no item form and is left out."""
    sid = f"oa-{uuid.uuid4()}"
    session = MemlaneSession(sid, server.target)
    await session.add_items(ITEMS[:1])
    with memlane.Memlane(server.target) as m:
        m.add("openai-agents", sid, [{"role": "assistant", "content": "from elsewhere"}])
        m.add(
            "openai-agents",
            sid,
            [{"role": "assistant", "content": None, "tool_calls": [{"id": "t9", "type": "function"}]}],
        )
    assert len(client.list_messages(session_id=sid).messages) == 3  # positive control: all stored
    assert await session.get_items() == [ITEMS[0], {"role": "assistant", "content": "from elsewhere"}]
    assert await session.get_items(limit=1) == [{"role": "assistant", "content": "from elsewhere"}]
    # pop_item drops the message with no item form and returns the one before it, as SQLiteSession
    # drops rows it cannot decode.
    assert await session.pop_item() == {"role": "assistant", "content": "from elsewhere"}
    assert len(client.list_messages(session_id=sid).messages) == 1
    await session.close()


@pytest.mark.parametrize("bad", ["", "a/b", "x" * 200])
async def test_a_bad_session_id_is_refused_precisely(server: SidecarThread, bad: str) -> None:
    session = MemlaneSession(bad, server.target)
    with pytest.raises(memlane.InvalidArgumentError):
        await session.add_items(ITEMS[:1])
    await session.close()


async def test_a_closed_session_refuses_new_items(server: SidecarThread, client: memlane.Client) -> None:
    session = MemlaneSession(f"oa-{uuid.uuid4()}", server.target)
    await session.add_items(ITEMS[:1])  # positive control: writes land while it is open
    client.close_session(session_id=session.session_id)
    with pytest.raises(memlane.FailedPreconditionError):
        await session.add_items(ITEMS[1:2])
    assert await session.get_items() == ITEMS[:1]  # still readable
    await session.close()
