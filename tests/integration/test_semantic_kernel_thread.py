"""Semantic Kernel on memlane, against SK's real ChatCompletionAgent (a scripted chat service, the real
kernel and its function auto-invocation) and SK's own in-memory ChatHistoryAgentThread: the same
conversation sends the model the same history through both, and ChatMessageContent objects are
restored equal, also in a fresh thread (a new process)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import pytest
from semantic_kernel import Kernel
from semantic_kernel.agents import ChatCompletionAgent, ChatHistoryAgentThread
from semantic_kernel.connectors.ai.function_choice_behavior import FunctionChoiceBehavior
from semantic_kernel.connectors.ai.prompt_execution_settings import PromptExecutionSettings
from semantic_kernel.contents import (
    ChatMessageContent,
    FunctionCallContent,
    FunctionResultContent,
    ImageContent,
    TextContent,
)
from semantic_kernel.contents.utils.author_role import AuthorRole
from semantic_kernel.functions import KernelArguments, kernel_function

import memlane
from memlane import Role
from memlane.integrations.semantic_kernel import NATIVE_FORMAT, MemlaneAgentThread
from memlane_server.background import SidecarThread
from tests.sk_model import ScriptedChat, call, say


class Weather:
    @kernel_function(description="The weather in a city.")
    def weather(self, city: Annotated[str, "The city."]) -> str:
        return f"sunny in {city}"


def _script() -> list[ChatMessageContent]:
    return [
        call("Weather", "weather", {"city": "Lisbon"}, "c1"),
        say("It is sunny in Lisbon."),
        call("Weather", "weather", {"city": "Porto"}, "c2"),
        say("Sunny in Porto too."),
        say("You asked about Lisbon and Porto."),
    ]


def _agent(service: ScriptedChat) -> ChatCompletionAgent:
    kernel = Kernel()
    kernel.add_service(service)
    kernel.add_plugin(Weather(), plugin_name="Weather")
    settings = PromptExecutionSettings(function_choice_behavior=FunctionChoiceBehavior.Auto())
    return ChatCompletionAgent(
        kernel=kernel,
        name="weather",
        instructions="Answer about the weather.",
        arguments=KernelArguments(settings),
    )


def _dump(messages: list[ChatMessageContent]) -> list[dict[str, Any]]:
    """What a model is sent (SK's own serialized form), without the provider's raw response objects and
    the agent's id SK stamps on messages (a random uuid per agent object)."""
    out = [m.model_dump(exclude={"inner_content"}, exclude_none=True) for m in messages]
    for d in out:
        d["metadata"].pop("agent_id", None)
    return out


async def _converse(thread: Any) -> tuple[ScriptedChat, list[ChatMessageContent]]:
    service = ScriptedChat(_script())
    agent = _agent(service)
    replies = []
    for question in ("Weather in Lisbon?", "And Porto?", "Which cities did I ask about?"):
        response = await agent.get_response(messages=question, thread=thread)
        replies.append(str(response.content))
        thread = response.thread
    assert replies == ["It is sunny in Lisbon.", "Sunny in Porto too.", "You asked about Lisbon and Porto."]
    return service, [m async for m in thread.get_messages()]


async def test_agent_sends_the_model_the_same_history_as_sk_s_thread(
    server: SidecarThread, client: memlane.Client, user_id: str
) -> None:
    reference, ref_history = await _converse(ChatHistoryAgentThread())
    sid = f"sk-{uuid.uuid4()}"
    thread = MemlaneAgentThread(sid, server.target, user_id=user_id, agent_id="weather-bot")
    ours, history = await _converse(thread)
    assert len(ours.sent) == 5
    assert [_dump(s) for s in ours.sent] == [_dump(s) for s in reference.sent]
    assert _dump(history) == _dump(ref_history) and len(history) == 10

    # A fresh thread on the same session (a new process) restores the same messages, equal.
    again = MemlaneAgentThread(sid, server.target, user_id=user_id)
    restored = [m async for m in again.get_messages()]
    assert _dump(restored) == _dump(ref_history)
    assert restored == [m.model_copy(update={"inner_content": None}) for m in history]

    # What memlane holds: one message per ChatMessageContent, kept whole, roles and tool ids derived.
    stored = client.list_messages(session_id=sid, page_size=100).messages
    assert {m.native.format for m in stored} == {NATIVE_FORMAT}
    assert [m.role for m in stored[:4]] == [
        Role.ROLE_USER,
        Role.ROLE_ASSISTANT,
        Role.ROLE_TOOL,
        Role.ROLE_ASSISTANT,
    ]
    assert list(stored[1].tool_call_ids) == ["c1"] == list(stored[2].tool_call_ids)
    assert stored[2].content == "sunny in Lisbon" and stored[3].source_agent_id == "weather-bot"
    await thread.close()
    await again.close()


MESSAGES = [
    ChatMessageContent(role=AuthorRole.SYSTEM, content="be brief"),
    ChatMessageContent(
        role=AuthorRole.USER, content='Hi, I\'m Dana. Ünïcode 🚀 "quotes" \\ too', name="dana"
    ),
    ChatMessageContent(
        role=AuthorRole.USER,
        items=[
            TextContent(text="what is this?"),
            ImageContent(data_uri="data:image/png;base64,iVBORw0KGgo="),
        ],
    ),
    ChatMessageContent(
        role=AuthorRole.ASSISTANT,
        items=[FunctionCallContent(id="c9", plugin_name="P", function_name="f", arguments='{"x": 1}')],
        metadata={"usage": {"tokens": 3}},
    ),
    ChatMessageContent(
        role=AuthorRole.TOOL,
        items=[FunctionResultContent(id="c9", plugin_name="P", function_name="f", result="42")],
    ),
    ChatMessageContent(role=AuthorRole.DEVELOPER, content="dev note"),
    ChatMessageContent(role=AuthorRole.ASSISTANT, content="the same text twice"),
    ChatMessageContent(role=AuthorRole.ASSISTANT, content="the same text twice"),
]


async def test_messages_round_trip_equal_and_delete_clears(
    server: SidecarThread, client: memlane.Client
) -> None:
    sid = f"sk-{uuid.uuid4()}"
    thread = MemlaneAgentThread(sid, server.target)
    assert [m async for m in thread.get_messages()] == []  # not created yet: the empty history
    reference = ChatHistoryAgentThread()
    for m in MESSAGES:
        await thread.on_new_message(m)
        await reference.on_new_message(m)
    ref = [m async for m in reference.get_messages()]
    ours = [m async for m in MemlaneAgentThread(sid, server.target).get_messages()]
    assert ours == ref == MESSAGES
    # A message that names this thread as its origin is not added twice (the reference's rule).
    echo = ChatMessageContent(role=AuthorRole.ASSISTANT, content="echo", metadata={"thread_id": sid})
    await thread.on_new_message(echo)
    assert len([m async for m in thread.get_messages()]) == len(MESSAGES)
    # Another client's turn reads as a plain message of its role.
    client.append_messages(
        session_id=sid, messages=[memlane.Message(role=Role.ROLE_USER, content="from elsewhere")]
    )
    last = [m async for m in thread.get_messages()][-1]
    assert (last.role, last.content) == (AuthorRole.USER, "from elsewhere")
    await thread.delete()
    assert client.list_messages(session_id=sid).messages == []
    assert client.get_session(session_id=sid).session.session_id == sid  # the session itself stays
    with pytest.raises(RuntimeError):
        _ = thread.id  # deleted, as SK's own threads
    await thread.close()
