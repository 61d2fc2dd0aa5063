"""OpenAI chat-format messages <-> memlane messages and assembled context (shared by both high-level
clients; no I/O here)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NotRequired, TypedDict

from ._errors import InvalidArgumentError
from .v1.context_pb2 import AssembleContextResponse, ContextMessage
from .v1.session_pb2 import Message, NativeMessage, Role

# The native format a chat dict is stored under, so context() gives back exactly what add() was given
# (tool_calls, tool_call_id, content parts).
NATIVE_FORMAT = "openai.chat"

_ROLES: dict[str, Role.ValueType] = {
    "user": Role.ROLE_USER,
    "assistant": Role.ROLE_ASSISTANT,
    "system": Role.ROLE_SYSTEM,
    "developer": Role.ROLE_DEVELOPER,
    "tool": Role.ROLE_TOOL,
    "function": Role.ROLE_TOOL,
}
_NAMES = {
    Role.ROLE_USER: "user",
    Role.ROLE_ASSISTANT: "assistant",
    Role.ROLE_SYSTEM: "system",
    Role.ROLE_DEVELOPER: "developer",
    Role.ROLE_TOOL: "tool",
}


class ChatMessage(TypedDict):
    """One message in the OpenAI chat format (``{"role": "user", "content": "..."}``)."""

    role: str
    content: NotRequired[str | list[dict[str, Any]] | None]
    name: NotRequired[str]
    tool_call_id: NotRequired[str]
    tool_calls: NotRequired[list[dict[str, Any]]]


def _text(content: object) -> str:
    """The text of a content string or list of content parts (images and audio carry no text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("text"))
    raise InvalidArgumentError(f"content must be a string or a list of parts, not {type(content).__name__}")


def to_message(chat: ChatMessage | Mapping[str, Any] | Message, agent_id: str) -> Message:
    """A memlane ``Message`` from a chat dict (kept verbatim as its native object) or a ``Message``."""
    if isinstance(chat, Message):
        return chat
    role = _ROLES.get(str(chat.get("role", "")))
    if role is None:
        raise InvalidArgumentError(f"role {chat.get('role')!r} is not one of {', '.join(_ROLES)}")
    text = _text(chat.get("content"))
    if not text and chat.get("tool_calls"):
        text = json.dumps(chat["tool_calls"], ensure_ascii=False)  # searchable, and never empty
    return Message(
        role=role,
        content=text,
        participant_name=str(chat.get("name") or ""),
        source_agent_id=agent_id if role == Role.ROLE_ASSISTANT else "",
        native=NativeMessage(format=NATIVE_FORMAT, json=json.dumps(dict(chat), ensure_ascii=False)),
    )


def to_messages(chats: Iterable[ChatMessage | Mapping[str, Any] | Message], agent_id: str) -> list[Message]:
    return [to_message(c, agent_id) for c in chats]


def _chat(m: ContextMessage) -> ChatMessage:
    if m.native.format == NATIVE_FORMAT and m.native.json:
        native = json.loads(m.native.json)
        if isinstance(native, dict) and "role" in native:
            out: ChatMessage = native  # type: ignore[assignment]  # what the caller stored
            return out
    chat: ChatMessage = {"role": _NAMES.get(m.role, "user"), "content": m.content}
    if m.name:
        chat["name"] = m.name
    return chat


def chat_from_context(responses: Sequence[AssembleContextResponse]) -> list[ChatMessage]:
    """Every block of an assembled context, in order, as chat messages: system prompt, profile, memories
    and summary come as system messages, the conversation as its own turns."""
    return [_chat(m) for r in responses for b in r.blocks for m in b.messages]
