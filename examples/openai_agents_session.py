"""An OpenAI Agents SDK agent whose memory is memlane (runs offline: the model is scripted).

    memlane serve &                                      # the sidecar
    python examples/openai_agents_session.py 127.0.0.1:50051

1. Two turns, one with a tool call: the agent's session is ``MemlaneSession``; every item (the user's
   turns, the function call, its output, the replies) is one memlane message, kept whole.
2. A fresh process resumes the conversation: the model is sent the whole history from the sidecar.
3. The session ends; memlane promotes what the user said to long-term memory; in a new session,
   ``memlane_instructions`` puts the recalled fact into the agent's instructions.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from typing import Any

from agents import Agent, Model, ModelResponse, Runner, Usage, function_tool, set_tracing_disabled
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

import memlane
from memlane.integrations.openai_agents import MemlaneSession, memlane_instructions

set_tracing_disabled(True)  # offline: no trace export


class ScriptedModel(Model):
    """Answers from a script and remembers what it was sent (a real agent uses an OpenAI model)."""

    def __init__(self, script: list[Any]) -> None:
        self.script, self.sent = list(script), []  # type: ignore[var-annotated]

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> ModelResponse:
        self.sent.append((system_instructions, input))
        return ModelResponse(output=[self.script.pop(0)], usage=Usage(), response_id=None)

    def stream_response(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError


def say(words: str) -> ResponseOutputMessage:
    part = ResponseOutputText(type="output_text", text=words, annotations=[])
    return ResponseOutputMessage(
        id=f"msg_{uuid.uuid4().hex}", type="message", role="assistant", status="completed", content=[part]
    )


@function_tool
def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"Sunny and 24 C in {city}."


async def turns(target: str, user: str, sid: str) -> None:
    call = ResponseFunctionToolCall(
        type="function_call", id="fc_1", call_id="call_1", name="weather", arguments='{"city": "Lisbon"}'
    )
    model = ScriptedModel([say("Nice to meet you, Dana."), call, say("Sunny and 24 C in Lisbon today.")])
    agent = Agent(name="concierge", instructions="You are a concierge.", model=model, tools=[weather])
    session = MemlaneSession(sid, target, user_id=user, agent_id="concierge")
    await Runner.run(agent, "Hi! My name is Dana and I live in Lisbon.", session=session)
    out = await Runner.run(agent, "What's the weather like at home today?", session=session)
    print("turn 2:", out.final_output)
    await session.close()


async def resume(target: str, user: str, sid: str) -> None:
    """A fresh process: the history the model is sent comes from the sidecar."""
    session = MemlaneSession(sid, target, user_id=user, agent_id="concierge")
    history = await session.get_items()
    print("resumed with", len(history), "items:", [i.get("type", i.get("role")) for i in history])
    model = ScriptedModel([say("You live in Lisbon.")])
    agent = Agent(name="concierge", instructions="You are a concierge.", model=model)
    await Runner.run(agent, "Where do I live?", session=session)
    assert model.sent[0][1][: len(history)] == history  # the whole conversation, exactly as stored
    await session.close()


async def recall(target: str, user: str, sid: str) -> None:
    async with memlane.AsyncClient(target, timeout=120) as c:
        await c.promote_session(session_id=sid, close=True)  # what an inactivity timeout does on its own
    session = MemlaneSession(f"{sid}-next", target, user_id=user, agent_id="concierge")
    model = ScriptedModel([say("Welcome back! Still in Lisbon?")])
    agent = Agent(
        name="concierge", instructions=memlane_instructions(session, "You are a concierge."), model=model
    )
    await Runner.run(agent, "Where do I live again?", session=session)
    instructions = model.sent[0][0]
    print("instructions of the new session:\n" + instructions)
    assert "Lisbon" in instructions
    await session.close()


def main() -> None:
    target = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
    if len(sys.argv) > 4:  # a child process: one step
        step = {"turns": turns, "resume": resume, "recall": recall}[sys.argv[2]]
        asyncio.run(step(target, sys.argv[3], sys.argv[4]))
        return
    user, sid = f"dana-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    for step_name in ("turns", "resume", "recall"):
        subprocess.run([sys.executable, __file__, target, step_name, user, sid], check=True)
    print("ok")


if __name__ == "__main__":
    main()
