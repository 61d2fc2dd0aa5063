"""A scripted model for the OpenAI Agents SDK (the SDK's own tests use the same pattern, FakeModel):
each call returns the next scripted output and records what the model was sent."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from agents import Model, ModelResponse, Usage
from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText


def text(content: str, id: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=id,
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=content, annotations=[], logprobs=[])],
    )


def call(name: str, arguments: str, call_id: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc_{call_id}", type="function_call", name=name, arguments=arguments, call_id=call_id
    )


@dataclass
class Sent:
    instructions: str | None
    input: list[TResponseInputItem]


class ScriptedModel(Model):
    def __init__(self, outputs: list[list[TResponseOutputItem]]) -> None:
        self.outputs = list(outputs)
        self.sent: list[Sent] = []

    async def get_response(
        self, system_instructions: str | None, input: str | list[TResponseInputItem], *args: Any, **kw: Any
    ) -> ModelResponse:
        items: list[TResponseInputItem] = (
            [{"role": "user", "content": input}] if isinstance(input, str) else input
        )
        self.sent.append(Sent(system_instructions, copy.deepcopy(items)))
        return ModelResponse(output=self.outputs.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kw: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("these tests do not stream")
