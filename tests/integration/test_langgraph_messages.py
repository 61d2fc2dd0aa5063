"""A graph's messages channel mirrored into the session: appends by id, RemoveMessage removes, sync and
async graphs alike, and nothing the mirror did not write is ever removed."""

from __future__ import annotations

import json
import uuid
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, RemoveMessage
from langgraph.graph import START, MessagesState, StateGraph

import memlane
from memlane import Message, Role
from memlane.integrations.langgraph import MemlaneSaver
from memlane_server.background import SidecarThread


def _id(m: AnyMessage) -> str:
    """A message's id: add_messages gives every message in the state one."""
    assert m.id is not None, m
    return m.id


def _graph(saver: MemlaneSaver) -> Any:
    def reply(state: MessagesState) -> dict[str, list[Any]]:
        last = state["messages"][-1]
        if last.content == "forget the first exchange":
            return {"messages": [RemoveMessage(id=_id(m)) for m in state["messages"][:2]]}
        return {"messages": [AIMessage(f"echo: {last.content}", id=f"ai-{last.id}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    return builder.compile(checkpointer=saver)


def test_messages_are_mirrored_and_removals_follow(server: SidecarThread, client: memlane.Client) -> None:
    thread = str(uuid.uuid4())
    config = {"configurable": {"thread_id": thread, "user_id": "mirror-user"}}
    saver = MemlaneSaver(server.target)
    graph = _graph(saver)
    graph.invoke({"messages": [HumanMessage("hello", id="h1")]}, config)
    # Another writer's message in the same session: never touched by the mirror.
    client.append_messages(session_id=thread, messages=[Message(role=Role.ROLE_SYSTEM, content="note")])
    graph.invoke({"messages": [HumanMessage("second", id="h2")]}, config)
    stored = client.list_messages(session_id=thread).messages
    assert [m.message_id for m in stored if m.role != Role.ROLE_SYSTEM] == ["h1", "ai-h1", "h2", "ai-h2"]
    first = stored[0]
    assert (
        first.native.format == "langchain" and json.loads(first.native.json)["kwargs"]["content"] == "hello"
    )
    assert client.get_session(session_id=thread).session.user_id == "mirror-user"

    # A fresh saver (a new process) knows nothing: it reads which messages it mirrored from the session.
    saver2 = MemlaneSaver(server.target)
    _graph(saver2).invoke({"messages": [HumanMessage("forget the first exchange", id="h3")]}, config)
    left = [m.message_id for m in client.list_messages(session_id=thread).messages]
    assert "h1" not in left and "ai-h1" not in left  # removed
    assert left[0] != "h2" and "h2" in left and "h3" in left  # the other writer's note stays first
    assert client.get_session(session_id=thread).session.message_count == len(left)
    saver.close()
    saver2.close()


async def test_async_graph_mirrors_too(server: SidecarThread, client: memlane.Client) -> None:
    thread = str(uuid.uuid4())
    saver = MemlaneSaver(server.target)
    graph = _graph(saver)
    config = {"configurable": {"thread_id": thread}}
    await graph.ainvoke({"messages": [HumanMessage("async hello", id="a1")]}, config)
    assert [m.message_id for m in client.list_messages(session_id=thread).messages] == ["a1", "ai-a1"]
    state = await graph.aget_state(config)
    assert [m.content for m in state.values["messages"]] == ["async hello", "echo: async hello"]
    await saver.aclose()
