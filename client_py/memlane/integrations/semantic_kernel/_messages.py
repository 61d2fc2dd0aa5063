"""Semantic Kernel ``ChatMessageContent`` <-> memlane session messages.

A message is stored whole as the native object (``format="semantic_kernel"``, SK's own pydantic JSON,
the form ``ChatHistory.serialize`` uses), so it is restored equal: items (text, function calls and
results, images...), name, metadata, encoding. Role, text and tool call ids are derived for memlane's
summaries, recall and promotion.
"""

from __future__ import annotations

from semantic_kernel.contents import ChatMessageContent, FunctionCallContent, FunctionResultContent
from semantic_kernel.contents.utils.author_role import AuthorRole

from memlane.v1 import session_pb2 as pb

NATIVE_FORMAT = "semantic_kernel"

_ROLES: dict[AuthorRole, pb.Role.ValueType] = {
    AuthorRole.USER: pb.ROLE_USER,
    AuthorRole.ASSISTANT: pb.ROLE_ASSISTANT,
    AuthorRole.SYSTEM: pb.ROLE_SYSTEM,
    AuthorRole.TOOL: pb.ROLE_TOOL,
    AuthorRole.DEVELOPER: pb.ROLE_DEVELOPER,
}
_AUTHORS = {role: author for author, role in _ROLES.items()}


def _text(m: ChatMessageContent) -> tuple[str, list[str]]:
    parts: list[str] = [m.content] if m.content else []
    calls: list[str] = []
    for item in m.items:
        if isinstance(item, FunctionCallContent):
            calls.append(item.id or "")
            parts.append(f"{item.name}({item.arguments or ''})")
        elif isinstance(item, FunctionResultContent):
            calls.append(item.id or "")
            parts.append(str(item.result))
    return "\n".join(parts), [c for c in calls if c]


def to_message(m: ChatMessageContent, author: str) -> pb.Message:
    role = _ROLES.get(m.role, pb.ROLE_USER)
    text, calls = _text(m)
    return pb.Message(
        role=role,
        content=text,
        participant_name=m.name or "",
        source_agent_id=author if role == pb.ROLE_ASSISTANT else "",
        tool_call_ids=calls,
        native=pb.NativeMessage(format=NATIVE_FORMAT, json=m.model_dump_json(exclude_none=True)),
    )


def to_content(m: pb.Message) -> ChatMessageContent | None:
    """The message ``m`` holds; a turn another client wrote reads as a plain text message of its role;
    None for tool traffic stored in another framework's format (it has no SK form)."""
    if m.native.format == NATIVE_FORMAT and m.native.json:
        return ChatMessageContent.model_validate_json(m.native.json)
    if m.role in _AUTHORS and m.role != pb.ROLE_TOOL and m.content and not m.tool_call_ids:
        return ChatMessageContent(role=_AUTHORS[m.role], content=m.content, name=m.participant_name or None)
    return None
