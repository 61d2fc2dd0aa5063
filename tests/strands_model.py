"""A scripted model for Strands Agents (Strands' own tests use the same pattern, MockedModelProvider):
each call streams the next scripted assistant message as the provider events Strands parses, and
records the messages it was sent."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncGenerator, AsyncIterable
from typing import Any

from strands.models import Model
from strands.types.content import Messages
from strands.types.event_loop import StopReason
from strands.types.streaming import StreamEvent


def text(words: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"text": words}]}


def call(name: str, args: dict[str, Any], use_id: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"toolUse": {"toolUseId": use_id, "name": name, "input": args}}]}


def guardrail(user_redaction: str, reply: str) -> dict[str, Any]:
    """A guardrail intervening: the user's turn is to be redacted, the reply replaced."""
    return {"role": "assistant", "content": [{"text": reply}], "redact": user_redaction}


class ScriptedModel(Model):
    def __init__(self, script: list[dict[str, Any]]) -> None:
        self.script = list(script)
        self.sent: list[Messages] = []

    def update_config(self, **model_config: Any) -> None:
        return None

    def get_config(self) -> Any:
        return {}

    def structured_output(self, *args: Any, **kwargs: Any) -> AsyncGenerator[dict[str, Any], None]:
        raise NotImplementedError

    async def stream(self, messages: Messages, *args: Any, **kwargs: Any) -> AsyncIterable[StreamEvent]:
        self.sent.append(copy.deepcopy(messages))
        turn = self.script.pop(0)
        yield {"messageStart": {"role": "assistant"}}
        for block in turn["content"]:
            if "toolUse" in block:
                use = block["toolUse"]
                yield {
                    "contentBlockStart": {
                        "start": {"toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}
                    }
                }
                yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(use["input"])}}}}
            else:
                yield {"contentBlockStart": {"start": {}}}
                yield {"contentBlockDelta": {"delta": {"text": block["text"]}}}
            yield {"contentBlockStop": {}}
        stop: StopReason
        if "redact" in turn:
            yield {"redactContent": {"redactUserContentMessage": turn["redact"]}}
            stop = "guardrail_intervened"
        else:
            stop = "tool_use" if any("toolUse" in b for b in turn["content"]) else "end_turn"
        yield {"messageStop": {"stopReason": stop}}
        yield {
            "metadata": {
                "usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2},
                "metrics": {"latencyMs": 1},
            }
        }
