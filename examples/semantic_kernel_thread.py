"""A Semantic Kernel agent whose chat history is memlane (runs offline: the chat service is scripted).

    memlane serve &                                      # the sidecar
    python examples/semantic_kernel_thread.py 127.0.0.1:50051

1. Two turns, one with a function call the kernel invokes: the agent's thread is
   ``MemlaneAgentThread``; every ChatMessageContent is one memlane message, kept whole.
2. A fresh process resumes the thread from the sidecar: the model is sent the whole history.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from typing import Annotated, Any, ClassVar

from semantic_kernel import Kernel
from semantic_kernel.agents import ChatCompletionAgent
from semantic_kernel.connectors.ai.chat_completion_client_base import ChatCompletionClientBase
from semantic_kernel.connectors.ai.function_choice_behavior import FunctionChoiceBehavior
from semantic_kernel.connectors.ai.prompt_execution_settings import PromptExecutionSettings
from semantic_kernel.contents import ChatHistory, ChatMessageContent, FunctionCallContent
from semantic_kernel.contents.utils.author_role import AuthorRole
from semantic_kernel.functions import KernelArguments, kernel_function

from memlane.integrations.semantic_kernel import MemlaneAgentThread


class ScriptedChat(ChatCompletionClientBase):
    """Answers from a script and remembers what it was sent (a real agent uses OpenAI, Azure...)."""

    SUPPORTS_FUNCTION_CALLING: ClassVar[bool] = True
    script: list[ChatMessageContent]
    sent: list[int]

    async def _inner_get_chat_message_contents(self, chat_history: ChatHistory, settings: Any) -> Any:
        self.sent.append(len(chat_history.messages))
        return [self.script.pop(0)]


def say(words: str) -> ChatMessageContent:
    return ChatMessageContent(role=AuthorRole.ASSISTANT, content=words)


class Weather:
    @kernel_function(description="Today's weather in a city.")
    def weather(self, city: Annotated[str, "The city."]) -> str:
        return f"Sunny and 24 C in {city}."


def agent(script: list[ChatMessageContent]) -> tuple[ChatCompletionAgent, ScriptedChat]:
    service = ScriptedChat(ai_model_id="scripted", script=script, sent=[])
    kernel = Kernel()
    kernel.add_service(service)
    kernel.add_plugin(Weather(), plugin_name="Weather")
    settings = PromptExecutionSettings(function_choice_behavior=FunctionChoiceBehavior.Auto())
    return ChatCompletionAgent(
        kernel=kernel,
        name="concierge",
        instructions="You are a concierge.",
        arguments=KernelArguments(settings),
    ), service


async def turns(target: str, user: str, sid: str) -> None:
    call = FunctionCallContent(
        id="call_1", plugin_name="Weather", function_name="weather", arguments=json.dumps({"city": "Lisbon"})
    )
    concierge, _ = agent(
        [
            say("Nice to meet you, Dana."),
            ChatMessageContent(role=AuthorRole.ASSISTANT, items=[call]),
            say("Sunny and 24 C in Lisbon today."),
        ]
    )
    thread = MemlaneAgentThread(sid, target, user_id=user, agent_id="concierge")
    await concierge.get_response(messages="Hi! My name is Dana and I live in Lisbon.", thread=thread)
    reply = await concierge.get_response(messages="What's the weather like at home today?", thread=thread)
    print("turn 2:", reply.content)
    await thread.close()


async def resume(target: str, user: str, sid: str) -> None:
    """A fresh process: the history the model is sent comes from the sidecar."""
    thread = MemlaneAgentThread(sid, target, user_id=user, agent_id="concierge")
    history = [m async for m in thread.get_messages()]
    print("resumed with", len(history), "messages:", [m.role.value for m in history])
    concierge, service = agent([say("You live in Lisbon.")])
    await concierge.get_response(messages="Where do I live?", thread=thread)
    assert service.sent == [len(history) + 2]  # the instructions, the history, the new turn
    print("the model was sent", service.sent[0], "messages")
    await thread.close()


def main() -> None:
    target = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:50051"
    if len(sys.argv) > 4:  # a child process: one step
        step = {"turns": turns, "resume": resume}[sys.argv[2]]
        asyncio.run(step(target, sys.argv[3], sys.argv[4]))
        return
    user, sid = f"dana-{uuid.uuid4().hex[:6]}", str(uuid.uuid4())
    for step_name in ("turns", "resume"):
        subprocess.run([sys.executable, __file__, target, step_name, user, sid], check=True)
    print("ok")


if __name__ == "__main__":
    main()
