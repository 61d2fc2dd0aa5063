"""A scripted chat completion service for Semantic Kernel (SK's own tests mock the service the same
way): each call answers the next scripted message and records the history it was sent. It supports
function calling, so the kernel's auto-invoke loop runs the real plugin functions."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from semantic_kernel.connectors.ai.chat_completion_client_base import ChatCompletionClientBase
from semantic_kernel.connectors.ai.prompt_execution_settings import PromptExecutionSettings
from semantic_kernel.contents import ChatHistory, ChatMessageContent, FunctionCallContent
from semantic_kernel.contents.utils.author_role import AuthorRole


def say(words: str) -> ChatMessageContent:
    return ChatMessageContent(role=AuthorRole.ASSISTANT, content=words)


def call(plugin: str, function: str, args: dict[str, Any], call_id: str) -> ChatMessageContent:
    fc = FunctionCallContent(
        id=call_id, plugin_name=plugin, function_name=function, arguments=json.dumps(args)
    )
    return ChatMessageContent(role=AuthorRole.ASSISTANT, items=[fc])


class ScriptedChat(ChatCompletionClientBase):
    SUPPORTS_FUNCTION_CALLING: ClassVar[bool] = True
    script: list[ChatMessageContent]
    sent: list[list[ChatMessageContent]]

    def __init__(self, script: list[ChatMessageContent]) -> None:
        super().__init__(ai_model_id="scripted", service_id="scripted", script=list(script), sent=[])  # type: ignore[call-arg]

    async def _inner_get_chat_message_contents(
        self, chat_history: ChatHistory, settings: PromptExecutionSettings
    ) -> list[ChatMessageContent]:
        self.sent.append([m.model_copy(deep=True) for m in chat_history.messages])
        return [self.script.pop(0)]
