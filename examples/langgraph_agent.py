"""A LangGraph agent whose memory is memlane (runs offline: the chat model is langchain-core's fake).

    memlane serve &                                   # the sidecar
    python examples/langgraph_agent.py 127.0.0.1:50051

1. Two turns in one thread: the checkpointer is ``MemlaneSaver``; the thread is a memlane session and
   the graph's ``messages`` are mirrored into it.
2. The thread is resumed from a fresh process: the graph state comes back from the sidecar.
3. The session ends; memlane promotes what the user said to long-term memory; a new session of the
   same user recalls it.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, MessagesState, StateGraph

import memlane
from memlane.integrations.langgraph import MemlaneSaver
from memlane.v1 import memory_pb2


def build_graph(saver: MemlaneSaver, replies: list[str]):  # type: ignore[no-untyped-def]
    model = GenericFakeChatModel(messages=iter(AIMessage(content=r) for r in replies))

    def chat(state: MessagesState) -> dict[str, list[AIMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("chat", chat)
    builder.add_edge(START, "chat")
    return builder.compile(checkpointer=saver)


def turns(target: str, user: str, thread: str) -> None:
    saver = MemlaneSaver(target, user_id=user, agent_id="")
    graph = build_graph(saver, ["Nice to meet you, Dana.", "Lisbon is lovely in spring."])
    config = {"configurable": {"thread_id": thread}}
    graph.invoke({"messages": [HumanMessage("Hi! My name is Dana.")]}, config)
    out = graph.invoke({"messages": [HumanMessage("I live in Lisbon.")]}, config)
    print("turn 2 state:", [m.content for m in out["messages"]])
    saver.close()


def resume(target: str, user: str, thread: str) -> None:
    """A fresh process: nothing in memory, the thread's state comes from the sidecar."""
    saver = MemlaneSaver(target, user_id=user)
    graph = build_graph(saver, ["You told me you live in Lisbon."])
    config = {"configurable": {"thread_id": thread}}
    before = graph.get_state(config).values["messages"]
    print("resumed with", len(before), "messages")
    out = graph.invoke({"messages": [HumanMessage("Where do I live?")]}, config)
    print("turn 3 state:", [m.content for m in out["messages"]])
    assert len(out["messages"]) == len(before) + 2
    with memlane.Client(target) as c:
        mirrored = [m.content for m in c.list_messages(session_id=thread).messages]
        print("session messages:", mirrored)
        assert mirrored == [m.content for m in out["messages"]]
    saver.close()


def recall(target: str, user: str, thread: str) -> None:
    with memlane.Client(target, timeout=120) as c:
        c.promote_session(session_id=thread, close=True)  # what an inactivity timeout does on its own
        fresh = c.create_session(user_id=user).session.session_id
        hits = c.search_memories(caller=memory_pb2.Caller(user_id=user), query="Where does the user live?")
        facts = [h.memory.content for h in hits.results]
        print(f"new session {fresh} recalls:", facts)
        assert any("Lisbon" in f for f in facts)


def main() -> None:
    target = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
    if len(sys.argv) > 4:  # a child process: one step
        {"turns": turns, "resume": resume, "recall": recall}[sys.argv[2]](target, sys.argv[3], sys.argv[4])
        return
    user, thread = f"dana-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    for step in ("turns", "resume", "recall"):
        subprocess.run([sys.executable, __file__, target, step, user, thread], check=True)
    print("ok")


if __name__ == "__main__":
    main()
