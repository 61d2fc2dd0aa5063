"""LangChain chat history and retrieval on memlane (runs offline: the chat model is langchain-core's
fake).

    memlane serve &                                    # the sidecar
    python examples/langchain_history.py 127.0.0.1:50051

1. Two turns, one with a tool call, kept in ``MemlaneChatMessageHistory``: every LangChain message is
   one memlane message, kept whole.
2. A fresh process reads the history back: the same messages, tool calls and usage metadata included.
3. The session ends; memlane promotes what the user said to long-term memory; ``MemlaneRetriever``
   finds it for a new conversation.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

import memlane
from memlane.integrations.langchain import MemlaneChatMessageHistory, MemlaneRetriever


def turns(target: str, user: str, sid: str) -> None:
    lookup = {"name": "weather", "args": {"city": "Lisbon"}, "id": "call_1", "type": "tool_call"}
    model = GenericFakeChatModel(
        messages=iter(
            [
                AIMessage("Nice to meet you, Dana."),
                AIMessage(
                    "",
                    tool_calls=[lookup],
                    usage_metadata={"input_tokens": 40, "output_tokens": 9, "total_tokens": 49},
                ),
                AIMessage("Sunny and 24 C in Lisbon today."),
            ]
        )
    )
    history = MemlaneChatMessageHistory(sid, target, user_id=user)
    history.add_message(HumanMessage("Hi! My name is Dana and I live in Lisbon."))
    history.add_message(model.invoke(history.messages))
    history.add_message(HumanMessage("What's the weather like at home today?"))
    call = model.invoke(history.messages)
    history.add_message(call)
    history.add_message(ToolMessage("Sunny, 24 C", tool_call_id="call_1", name="weather"))
    history.add_message(model.invoke(history.messages))
    print("turn 2:", history.messages[-1].content)
    history.close()


def resume(target: str, user: str, sid: str) -> None:
    """A fresh process: the history comes back from the sidecar, message for message."""
    history = MemlaneChatMessageHistory(sid, target, user_id=user)
    messages = history.messages
    print("resumed with", len(messages), "messages:", [type(m).__name__ for m in messages])
    call = messages[3]
    assert isinstance(call, AIMessage) and call.tool_calls[0]["args"] == {"city": "Lisbon"}
    assert call.usage_metadata is not None and call.usage_metadata["total_tokens"] == 49
    history.close()


def recall(target: str, user: str, sid: str) -> None:
    with memlane.Client(target, timeout=120) as c:
        c.promote_session(session_id=sid, close=True)  # what an inactivity timeout does on its own
    docs = MemlaneRetriever(target=target, user_id=user, k=3).invoke("Where does the user live?")
    for d in docs:
        print(f"recalls: {d.page_content!r} score={d.metadata['score']:.3f}")
    assert any("Lisbon" in d.page_content for d in docs)


def main() -> None:
    target = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
    if len(sys.argv) > 4:  # a child process: one step
        {"turns": turns, "resume": resume, "recall": recall}[sys.argv[2]](target, sys.argv[3], sys.argv[4])
        return
    user, sid = f"dana-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    for step in ("turns", "resume", "recall"):
        subprocess.run([sys.executable, __file__, target, step, user, sid], check=True)
    print("ok")


if __name__ == "__main__":
    main()
