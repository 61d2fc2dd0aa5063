"""OpenAI Agents SDK input items <-> memlane session messages.

An item (a Responses API input item: a message, a function call, its output, reasoning...) is stored
whole as the message's native object (``format="openai.responses"``), so ``get_items`` gives back
exactly what ``add_items`` was given. The role, text and tool call ids are derived from it so that
memlane's summaries, recall and promotion see the conversation too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from memlane.v1 import session_pb2 as pb

NATIVE_FORMAT = "openai.responses"
CHAT_FORMAT = "openai.chat"  # what Memlane.add stores
ITEM_TYPE_KEY = "openai_agents.type"

_ROLES: dict[str, pb.Role.ValueType] = {
    "user": pb.ROLE_USER,
    "assistant": pb.ROLE_ASSISTANT,
    "system": pb.ROLE_SYSTEM,
    "developer": pb.ROLE_DEVELOPER,
}
_NAMES = {role: name for name, role in _ROLES.items()}


def _text(content: object) -> str:
    """The text of a content string or list of content parts (input_text, output_text, refusal...)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = (p.get("text") or p.get("refusal") for p in content if isinstance(p, Mapping))
        return "\n".join(str(p) for p in parts if p)
    return ""


def _summary(item: Mapping[str, Any], kind: str) -> tuple[pb.Role.ValueType, str, list[str]]:
    """Role, searchable text and tool call ids of one item."""
    call_id = str(item.get("call_id") or "")
    calls = [call_id] if call_id else []
    if kind == "message" or "role" in item:
        return _ROLES.get(str(item.get("role")), pb.ROLE_USER), _text(item.get("content")), []
    if kind == "function_call":
        return pb.ROLE_ASSISTANT, f"{item.get('name', '')}({item.get('arguments', '')})", calls
    if kind.endswith("_output"):  # function_call_output, computer_call_output, custom_tool_call_output...
        out = item.get("output")
        return pb.ROLE_TOOL, out if isinstance(out, str) else _text(out), calls
    if kind == "reasoning":
        return pb.ROLE_ASSISTANT, _text(item.get("summary")), []
    return pb.ROLE_ASSISTANT, "", calls  # hosted tool calls and the like: kept whole, no text


def to_message(item: Mapping[str, Any], agent_id: str) -> pb.Message:
    kind = str(item.get("type") or "message")
    role, text, calls = _summary(item, kind)
    return pb.Message(
        role=role,
        content=text,
        source_agent_id=agent_id if role == pb.ROLE_ASSISTANT else "",
        tool_call_ids=calls,
        native=pb.NativeMessage(format=NATIVE_FORMAT, json=json.dumps(dict(item), ensure_ascii=False)),
        metadata={ITEM_TYPE_KEY: kind},
    )


def _tool_traffic(m: pb.Message) -> bool:
    if m.tool_call_ids:
        return True
    if m.native.format == CHAT_FORMAT and m.native.json:  # Memlane.add keeps tool calls in the native only
        native = json.loads(m.native.json)
        return isinstance(native, dict) and bool(native.get("tool_calls") or native.get("tool_call_id"))
    return False


def to_item(m: pb.Message) -> dict[str, Any] | None:
    """The item a message holds: its native object, or for a plain chat turn written by another client
    (``Memlane.add``, another framework) an easy input message with its text; None for what has no
    item form (tool traffic stored in another framework's format)."""
    if m.native.format == NATIVE_FORMAT and m.native.json:
        native = json.loads(m.native.json)
        if isinstance(native, dict):
            return native
    if m.role in _NAMES and m.content and not _tool_traffic(m):
        return {"role": _NAMES[m.role], "content": m.content}
    return None
