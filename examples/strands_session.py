"""A Strands agent whose memory is memlane (runs offline: the model is scripted).

    memlane serve &                                      # the sidecar
    python examples/strands_session.py 127.0.0.1:50051

1. Two turns, one with a tool call: the agent's session manager is ``MemlaneSessionManager``; every
   message is one memlane message, the agent's state a checkpoint of the session.
2. A fresh process resumes the conversation: the agent is restored from the sidecar, state included.
3. The agent's ``MemoryManager`` uses ``MemlaneMemoryStore``: the model stores a fact with
   ``add_memory``; in a new session, another agent finds it with ``search_memory``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterable
from typing import Any

from strands import Agent, tool
from strands.memory import MemoryManager
from strands.models import Model

from memlane.integrations.strands import MemlaneMemoryStore, MemlaneSessionManager


class ScriptedModel(Model):
    """Answers from a script and remembers what it was sent (a real agent uses Bedrock, OpenAI...)."""

    def __init__(self, script: list[dict[str, Any]]) -> None:
        self.script, self.sent = list(script), []  # type: ignore[var-annotated]

    def update_config(self, **config: Any) -> None: ...

    def get_config(self) -> Any:
        return {}

    def structured_output(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError

    async def stream(self, messages: Any, *a: Any, **k: Any) -> AsyncIterable[Any]:
        self.sent.append(json.loads(json.dumps(messages, default=str)))
        block = self.script.pop(0)
        yield {"messageStart": {"role": "assistant"}}
        if "tool" in block:
            start = {"toolUse": {"toolUseId": block["id"], "name": block["tool"]}}
            yield {"contentBlockStart": {"start": start}}
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(block["input"])}}}}
        else:
            yield {"contentBlockStart": {"start": {}}}
            yield {"contentBlockDelta": {"delta": {"text": block["text"]}}}
        yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "tool_use" if "tool" in block else "end_turn"}}


@tool
def weather(city: str) -> str:
    """Today's weather in a city.

    Args:
        city: The city.
    """
    return f"Sunny and 24 C in {city}."


def turns(target: str, user: str, sid: str) -> None:
    model = ScriptedModel(
        [
            {"text": "Nice to meet you, Dana."},
            {"tool": "weather", "id": "t1", "input": {"city": "Lisbon"}},
            {"text": "Sunny and 24 C in Lisbon today."},
        ]
    )
    manager = MemlaneSessionManager(sid, target, user_id=user, agent_id="concierge")
    agent = Agent(
        agent_id="concierge", model=model, tools=[weather], session_manager=manager, callback_handler=None
    )
    agent("Hi! My name is Dana and I live in Lisbon.")
    agent.state.set("home", "Lisbon")
    print("turn 2:", agent("What's the weather like at home today?"))


def resume(target: str, user: str, sid: str) -> None:
    """A fresh process: the history and the state come from the sidecar."""
    manager = MemlaneSessionManager(sid, target, user_id=user, agent_id="concierge")
    model = ScriptedModel([{"text": "You live in Lisbon."}])
    agent = Agent(agent_id="concierge", model=model, session_manager=manager, callback_handler=None)
    print("resumed with", len(agent.messages), "messages; state:", agent.state.get())
    assert agent.state.get("home") == "Lisbon"
    agent("Where do I live?")
    assert len(model.sent[0]) == 7  # 2 user turns, the call, its result, 2 replies, and this turn
    print("the model was sent", len(model.sent[0]), "messages")


def remember(target: str, user: str, sid: str) -> None:
    store = MemlaneMemoryStore(target, user_id=user, agent_id="concierge")
    model = ScriptedModel(
        [
            {"tool": "add_memory", "id": "m1", "input": {"entries": ["Dana is vegetarian."]}},
            {"text": "Noted."},
        ]
    )
    memory = MemoryManager(stores=[store], add_tool_config=True, injection=False)
    Agent(model=model, plugins=[memory], callback_handler=None)("I'm vegetarian, remember that.")

    model = ScriptedModel(
        [
            {"tool": "search_memory", "id": "s1", "input": {"query": "what does Dana eat?"}},
            {"text": "Vegetarian."},
        ]
    )
    agent = Agent(
        model=model, plugins=[MemoryManager(stores=[store], injection=False)], callback_handler=None
    )
    agent("Book me a dinner, you know my diet.")
    found = json.dumps(model.sent[-1])
    print("search_memory found:", "Dana is vegetarian." in found)
    assert "Dana is vegetarian." in found


def main() -> None:
    target = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
    if len(sys.argv) > 4:  # a child process: one step
        {"turns": turns, "resume": resume, "remember": remember}[sys.argv[2]](
            target, sys.argv[3], sys.argv[4]
        )
        return
    user, sid = f"dana-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    for step in ("turns", "resume", "remember"):
        subprocess.run([sys.executable, __file__, target, step, user, sid], check=True)
    print("ok")


if __name__ == "__main__":
    main()
