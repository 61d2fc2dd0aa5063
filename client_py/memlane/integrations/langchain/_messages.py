"""LangChain messages <-> memlane session messages.

A message is stored whole as the native object (``format="langchain"``: LangChain's own serialized
form, ``dumpd``), so it comes back equal: tool calls, invalid tool calls, usage and response metadata,
additional kwargs, ids, names, chunks. Role, text and tool call ids are derived for memlane's summaries,
recall and promotion. The LangGraph mirror stores its messages the same way.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any

from langchain_core._api import LangChainBetaWarning
from langchain_core.load import dumpd, load
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    ChatMessageChunk,
    FunctionMessage,
    FunctionMessageChunk,
    HumanMessage,
    HumanMessageChunk,
    RemoveMessage,
    SystemMessage,
    SystemMessageChunk,
    ToolMessage,
    ToolMessageChunk,
)

from memlane.v1 import session_pb2 as pb

NATIVE_FORMAT = "langchain"

# Every message class and nothing else is revived from a session (its content is caller data);
# LangChain's own "messages" allowlist leaves out the function messages.
_REVIVABLE: list[type[Any]] = [
    AIMessage,
    AIMessageChunk,
    ChatMessage,
    ChatMessageChunk,
    FunctionMessage,
    FunctionMessageChunk,
    HumanMessage,
    HumanMessageChunk,
    RemoveMessage,
    SystemMessage,
    SystemMessageChunk,
    ToolMessage,
    ToolMessageChunk,
]

_ROLES = {
    "human": pb.ROLE_USER,
    "user": pb.ROLE_USER,
    "ai": pb.ROLE_ASSISTANT,
    "assistant": pb.ROLE_ASSISTANT,
    "system": pb.ROLE_SYSTEM,
    "developer": pb.ROLE_DEVELOPER,
    "tool": pb.ROLE_TOOL,
    "function": pb.ROLE_TOOL,
}


def _role(m: BaseMessage) -> pb.Role.ValueType:
    # Chunks' types are "AIMessageChunk", "HumanMessageChunk"...; a ChatMessage carries its own role.
    kind = m.role if isinstance(m, ChatMessage) else m.type
    kind = kind.removesuffix("MessageChunk").lower()
    return _ROLES.get(kind, pb.ROLE_USER)


def _tool_call_ids(m: BaseMessage) -> list[str]:
    if isinstance(m, AIMessage):
        calls = [*m.tool_calls, *m.invalid_tool_calls]
        return [str(c["id"]) for c in calls if c.get("id")]
    if isinstance(m, ToolMessage):
        return [m.tool_call_id] if m.tool_call_id else []
    return []


def to_message(
    m: BaseMessage, *, message_id: str = "", metadata: Mapping[str, str] | None = None
) -> pb.Message:
    """``message_id`` empty: the client makes one (the LangChain id travels in the native object)."""
    return pb.Message(
        message_id=message_id,
        role=_role(m),
        content=m.text,
        participant_name=m.name or "",
        native=pb.NativeMessage(format=NATIVE_FORMAT, json=json.dumps(dumpd(m), default=str)),
        tool_call_ids=_tool_call_ids(m),
        metadata=dict(metadata or {}),
    )


def _revive(native: str) -> BaseMessage | None:
    """The message class a native object names, or None for anything else (another writer's object
    naming a class that is not a message is never constructed)."""
    with warnings.catch_warnings():  # `load` is marked beta; it is LangChain's own reader
        warnings.simplefilter("ignore", LangChainBetaWarning)
        try:
            # A value JSON cannot hold (a datetime, an object) was stored as its repr: it reads as None.
            out = load(json.loads(native), allowed_objects=_REVIVABLE, ignore_unserializable_fields=True)
        except (ValueError, TypeError, KeyError, NotImplementedError):
            return None
    return out if isinstance(out, BaseMessage) else None


def from_message(m: pb.Message) -> BaseMessage:
    """The LangChain message a session message holds; a turn another client wrote (no LangChain
    object) becomes the plain message of its role, under its memlane id."""
    if m.native.format == NATIVE_FORMAT and m.native.json:
        out = _revive(m.native.json)
        if out is not None:
            return out
    common: dict[str, Any] = {"content": m.content, "id": m.message_id}
    if m.participant_name:
        common["name"] = m.participant_name
    if m.role == pb.ROLE_ASSISTANT:
        return AIMessage(**common)
    if m.role in (pb.ROLE_SYSTEM, pb.ROLE_DEVELOPER):
        return SystemMessage(**common)
    if m.role == pb.ROLE_TOOL and m.tool_call_ids:
        return ToolMessage(tool_call_id=m.tool_call_ids[0], **common)
    return HumanMessage(**common)
