"""Input limits and validation of what clients send. Messages name the offending field."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from ..errors import InvalidArgument, ResourceExhausted
from .ids import check_id
from .model import Message, Role, VisibilityKind


@dataclass(frozen=True, slots=True)
class Limits:
    max_message_bytes: int = 256 * 1024  # content + native object, UTF-8
    max_batch_messages: int = 500
    max_batch_bytes: int = 4 * 1024 * 1024
    max_metadata_entries: int = 64
    max_text_field_bytes: int = 1024  # names, agent ids, groups, metadata values


def check_short(value: str, field: str, limits: Limits) -> None:
    if len(value.encode()) > limits.max_text_field_bytes:
        raise InvalidArgument(f"{field} is longer than {limits.max_text_field_bytes} bytes")


def check_metadata(md: dict[str, str], field: str, limits: Limits) -> None:
    if len(md) > limits.max_metadata_entries:
        raise InvalidArgument(f"{field} has {len(md)} entries; at most {limits.max_metadata_entries}")
    for k, v in md.items():
        if not k:
            raise InvalidArgument(f"{field} has an empty key")
        check_short(k, f"{field} key", limits)
        check_short(v, f"{field}[{k!r}]", limits)


def check_batch(messages: list[Message], limits: Limits) -> None:
    """Validates a batch before anything is written. Raises on the first bad message."""
    if not messages:
        raise InvalidArgument("messages must not be empty")
    if len(messages) > limits.max_batch_messages:
        raise ResourceExhausted(
            f"batch has {len(messages)} messages; at most {limits.max_batch_messages} per call"
        )
    total = 0
    seen: set[str] = set()
    for i, m in enumerate(messages):
        f = f"messages[{i}]"
        check_id(m.message_id, f"{f}.message_id", required=False)
        if m.message_id:
            if m.message_id in seen:
                raise InvalidArgument(f"{f}.message_id {m.message_id!r} appears twice in the batch")
            seen.add(m.message_id)
        if m.role not in Role or m.role == Role.UNSPECIFIED:
            raise InvalidArgument(f"{f}.role must be one of user, assistant, system, tool, developer")
        if m.visibility not in VisibilityKind:
            raise InvalidArgument(f"{f}.visibility is not a known visibility kind")
        if m.visibility == VisibilityKind.GROUP and not m.visibility_group:
            raise InvalidArgument(f"{f}.visibility_group is required for group visibility")
        if m.visibility == VisibilityKind.AGENT and not m.source_agent_id:
            raise InvalidArgument(f"{f}.source_agent_id is required for agent-private visibility")
        size = len(m.content.encode()) + len(m.native_json.encode())
        if size > limits.max_message_bytes:
            raise ResourceExhausted(
                f"{f} is {size} bytes; the limit is {limits.max_message_bytes} (content + native object)"
            )
        total += size
        if not m.content and not m.native_json and not m.tool_call_ids:
            raise InvalidArgument(f"{f} has no content, native object or tool call")
        if m.native_json:
            if not m.native_format:
                raise InvalidArgument(f"{f}.native.format is required with native.json")
            try:
                orjson.loads(m.native_json)
            except orjson.JSONDecodeError as exc:
                raise InvalidArgument(f"{f}.native.json is not valid JSON: {exc}") from exc
        for name in ("source_agent_id", "participant_name", "user_id", "channel", "visibility_group"):
            check_short(getattr(m, name), f"{f}.{name}", limits)
        check_metadata(m.metadata, f"{f}.metadata", limits)
        if m.created_at_ms < 0:
            raise InvalidArgument(f"{f}.created_at_unix_ms must not be negative")
    if total > limits.max_batch_bytes:
        raise ResourceExhausted(f"batch is {total} bytes; the limit is {limits.max_batch_bytes}")
