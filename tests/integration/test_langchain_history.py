"""``MemlaneChatMessageHistory`` against LangChain's own ``InMemoryChatMessageHistory``: every message
type comes back equal after a round trip through the sidecar, sync and async, and a
``RunnableWithMessageHistory`` chain sends its model the same history through both."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    ChatMessageChunk,
    FunctionMessage,
    FunctionMessageChunk,
    HumanMessage,
    HumanMessageChunk,
    SystemMessage,
    SystemMessageChunk,
    ToolMessage,
    ToolMessageChunk,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.history import RunnableWithMessageHistory

import memlane
from memlane import Role
from memlane.integrations.langchain import NATIVE_FORMAT, MemlaneChatMessageHistory
from memlane_server.background import SidecarThread

EVERY_TYPE: list[BaseMessage] = [
    SystemMessage("You are terse.", id="s1"),
    HumanMessage(
        "Hi, I'm Dana. Ünïcode 🚀 \"quotes\" \\ and ' too",
        id="h1",
        name="dana",
        additional_kwargs={"x": [1, {"y": None}]},
        response_metadata={"r": 2},
    ),
    HumanMessage([{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "data:,x"}}]),
    AIMessage(
        "",
        id="a1",
        name="bot",
        tool_calls=[{"name": "lookup", "args": {"q": "x", "n": 2}, "id": "c1", "type": "tool_call"}],
        invalid_tool_calls=[
            {
                "name": "broken",
                "args": "{not json",
                "id": "c2",
                "error": "bad json",
                "type": "invalid_tool_call",
            }
        ],
        usage_metadata={
            "input_tokens": 3,
            "output_tokens": 4,
            "total_tokens": 7,
            "input_token_details": {"cache_read": 1},
            "output_token_details": {"reasoning": 2},
        },
        response_metadata={"model_name": "m-1", "finish_reason": "tool_calls", "logprobs": None},
        additional_kwargs={"refusal": None, "function_call": {"name": "lookup", "arguments": "{}"}},
    ),
    ToolMessage(
        "result", tool_call_id="c1", id="t1", name="lookup", status="error", artifact={"raw": [1, 2]}
    ),
    FunctionMessage(content="out", name="fn", id="f1"),
    ChatMessage(content="a critique", role="critic", id="c1x"),
    AIMessage("The answer.", id="a2"),
    AIMessageChunk(
        content="chunk",
        id="ac1",
        tool_call_chunks=[{"name": "f", "args": '{"a"', "id": "c3", "index": 0, "type": "tool_call_chunk"}],
        usage_metadata={"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
        chunk_position="last",
    ),
    HumanMessageChunk(content="hc", id="hc1"),
    ToolMessageChunk(content="tc", tool_call_id="c9"),
    SystemMessageChunk(content="sc"),
    FunctionMessageChunk(content="fc", name="fn"),
    ChatMessageChunk(content="cc", role="r"),
    HumanMessage("the same text twice"),
    HumanMessage("the same text twice"),
]


def _history(server: SidecarThread, **kw: Any) -> MemlaneChatMessageHistory:
    return MemlaneChatMessageHistory(f"lc-{uuid.uuid4()}", server.target, **kw)


def test_every_message_type_round_trips_equal(server: SidecarThread, client: memlane.Client) -> None:
    history = _history(server, user_id="dana")
    assert history.messages == []  # not created yet: empty
    history.add_messages(EVERY_TYPE[:5])
    for m in EVERY_TYPE[5:]:
        history.add_message(m)
    fresh = MemlaneChatMessageHistory(history.session_id, server.target)  # a new process, in effect
    back = fresh.messages
    assert back == EVERY_TYPE
    assert [type(m) for m in back] == [type(m) for m in EVERY_TYPE]
    reference = InMemoryChatMessageHistory()
    reference.add_messages(EVERY_TYPE)
    assert back == reference.messages

    stored = client.list_messages(session_id=history.session_id, page_size=100).messages
    assert {m.native.format for m in stored} == {NATIVE_FORMAT}
    assert [m.role for m in stored[:7]] == [
        Role.ROLE_SYSTEM,
        Role.ROLE_USER,
        Role.ROLE_USER,
        Role.ROLE_ASSISTANT,
        Role.ROLE_TOOL,
        Role.ROLE_TOOL,
        Role.ROLE_USER,
    ]
    assert list(stored[3].tool_call_ids) == ["c1", "c2"] and list(stored[4].tool_call_ids) == ["c1"]
    assert stored[1].participant_name == "dana" and stored[2].content == "look"
    assert stored[8].role == Role.ROLE_ASSISTANT  # a chunk keeps its message's role
    assert client.get_session(session_id=history.session_id).session.user_id == "dana"
    history.close()
    fresh.close()


async def test_async_methods_round_trip_and_clear(server: SidecarThread) -> None:
    history = _history(server)
    assert await history.aget_messages() == []
    await history.aadd_messages(EVERY_TYPE)
    assert await history.aget_messages() == EVERY_TYPE
    assert history.messages == EVERY_TYPE  # sync and async read the same session
    await history.aclear()
    assert await history.aget_messages() == []
    await history.aadd_messages(EVERY_TYPE[:2])  # the session goes on after a clear
    assert await history.aget_messages() == EVERY_TYPE[:2]
    await history.aclose()


def test_clear_and_unknown_sessions(server: SidecarThread, client: memlane.Client) -> None:
    history = _history(server)
    history.clear()  # unknown session: nothing to do, no error
    history.add_messages(EVERY_TYPE[:3])
    assert len(history.messages) == 3
    history.clear()
    assert history.messages == []
    assert client.get_session(session_id=history.session_id).session.message_count == 0
    history.close()


def test_a_chain_with_message_history_sends_the_model_the_same_history(server: SidecarThread) -> None:
    def run(get_history: Any) -> list[list[BaseMessage]]:
        replies = iter([AIMessage(r, id=f"r{i}") for i, r in enumerate(["Hello Dana.", "Lisbon.", "Bye."])])
        model = GenericFakeChatModel(messages=replies)
        seen: list[list[BaseMessage]] = []
        prompt = ChatPromptTemplate.from_messages(
            [("system", "Be brief."), MessagesPlaceholder("history"), ("human", "{input}")]
        )

        def record(value: Any) -> Any:
            seen.append(value.to_messages())
            return value

        chain = RunnableWithMessageHistory(
            prompt | record | model,
            get_history,
            input_messages_key="input",
            history_messages_key="history",
        )
        cfg: RunnableConfig = {"configurable": {"session_id": f"lc-{uuid.uuid4()}"}}
        for text in ["Hi, I'm Dana.", "I live in Lisbon.", "Where do I live?"]:
            chain.invoke({"input": text}, cfg)
        return seen

    stores: dict[str, InMemoryChatMessageHistory] = {}
    reference = run(lambda sid: stores.setdefault(sid, InMemoryChatMessageHistory()))
    ours = run(lambda sid: MemlaneChatMessageHistory(sid, server.target))
    assert len(ours[-1]) == 1 + 4 + 1  # system, two exchanges, the new question
    # Message ids: the chain gives human turns none; both stores return what they were given.
    assert ours == reference


def test_turns_written_by_other_clients_read_as_plain_messages(
    server: SidecarThread, client: memlane.Client
) -> None:
    history = _history(server)
    history.add_messages([HumanMessage("from langchain", id="h1")])
    with memlane.Memlane(server.target) as m:
        m.add("langchain", history.session_id, [{"role": "assistant", "content": "from elsewhere"}])
    back = history.messages
    assert back[0] == HumanMessage("from langchain", id="h1")
    stored = client.list_messages(session_id=history.session_id).messages
    assert back[1] == AIMessage("from elsewhere", id=stored[1].message_id)
    history.close()


def test_values_json_cannot_hold_come_back_as_none(server: SidecarThread) -> None:
    """The one difference from InMemoryChatMessageHistory: the session stores JSON, so a value JSON
    cannot hold (a datetime, an arbitrary object) in additional_kwargs, response_metadata or a tool
    artifact comes back as None; everything else in the message is intact."""
    when = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    msg = AIMessage("hi", id="a1", additional_kwargs={"when": when, "n": 1})
    tool = ToolMessage("out", tool_call_id="c1", artifact=object())
    history = _history(server)
    history.add_messages([msg, tool])
    back = history.messages
    assert back[0] == AIMessage("hi", id="a1", additional_kwargs={"when": None, "n": 1})
    assert back[0] != msg  # the difference, shown
    assert isinstance(back[1], ToolMessage) and back[1].artifact is None and back[1].content == "out"
    history.close()


@pytest.mark.parametrize("bad", ["a/b", "x" * 200])
def test_a_bad_session_id_is_refused_precisely(server: SidecarThread, bad: str) -> None:
    history = MemlaneChatMessageHistory(bad, server.target)
    with pytest.raises(memlane.InvalidArgumentError):
        history.add_messages([HumanMessage("hi")])
    history.close()


def test_a_native_object_naming_another_class_is_never_constructed(
    server: SidecarThread, client: memlane.Client
) -> None:
    history = _history(server)
    history.add_messages([HumanMessage("first", id="h1")])  # creates the session
    hostile = '{"lc": 1, "type": "constructor", "id": ["langchain_core", "prompts", "PromptTemplate"], '
    hostile += '"kwargs": {"template": "{x}", "input_variables": ["x"]}}'
    client.append_messages(
        session_id=history.session_id,
        messages=[
            memlane.Message(
                role=Role.ROLE_USER,
                content="plain text",
                native=memlane.NativeMessage(format=NATIVE_FORMAT, json=hostile),
            )
        ],
    )
    back = history.messages
    assert back[0] == HumanMessage("first", id="h1")  # positive control: a real message is revived
    assert type(back[1]) is HumanMessage and back[1].content == "plain text"
    history.close()
