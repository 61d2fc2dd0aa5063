"""Input limits and validation of what clients send. Messages name the offending field."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from ..errors import InvalidArgument, ResourceExhausted
from ..ids import check_id
from .model import Message, Role, VisibilityKind


@dataclass(frozen=True, slots=True)
class Limits:
    """What one call may send. The batch bounds are the operator's settings (``max_message_bytes``,
    ``max_batch_messages``, ``max_batch_bytes``; defaults in config.py), built once in wiring/stores.py
    and shared by every call that takes messages (AppendMessages, ExtractMemories, user import); the
    others are fixed."""

    max_message_bytes: int  # every string of a message, UTF-8 (see message_bytes)
    max_batch_messages: int
    max_batch_bytes: int
    max_metadata_entries: int = 64
    max_list_entries: int = 256  # planning steps, invoked, tool call ids, participants, tags
    max_text_field_bytes: int = 1024  # names, agent ids, groups, metadata values, list entries


# How deeply a native object may nest: far beyond any chat format (a few levels; a tool's JSON schema a
# few dozen), and well under the ~1,000 frames at which Python's json (the client reading it back,
# memlane/_chat.py) raises RecursionError. orjson alone refuses only past 1,024.
MAX_NATIVE_DEPTH = 128


def json_depth(value: object) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list):
            deepest = max(deepest, depth + 1)
            stack.extend((item, depth + 1) for item in v)
    return deepest


# The accepted range of a caller-given time (``created_at_unix_ms``): from 2000-01-01T00:00:00Z to one
# day past the server's clock. Outside it a time is a bug (seconds sent as ms, a year 10000) that would
# fail later work (archive partitions, Parquet timestamps) long after the write was acknowledged.
MIN_TIMESTAMP_MS = 946_684_800_000
MAX_FUTURE_SKEW_MS = 24 * 3600 * 1000


def check_short(value: str, field: str, limits: Limits) -> None:
    if len(value.encode()) > limits.max_text_field_bytes:
        raise InvalidArgument(
            f"{field} is longer than {limits.max_text_field_bytes} bytes", field=field, reason="TOO_LONG"
        )


def check_metadata(md: dict[str, str], field: str, limits: Limits) -> None:
    if len(md) > limits.max_metadata_entries:
        raise InvalidArgument(
            f"{field} has {len(md)} entries; at most {limits.max_metadata_entries}",
            field=field,
            reason="TOO_MANY_ENTRIES",
        )
    for k, v in md.items():
        if not k:
            raise InvalidArgument(f"{field} has an empty key", field=field, reason="EMPTY_KEY")
        check_short(k, f"{field} key", limits)
        check_short(v, f"{field}[{k!r}]", limits)


def check_list(values: Sequence[str], field: str, limits: Limits, *, short: bool = True) -> None:
    """Bounds a repeated field; ``short`` also bounds each entry (names and ids, not free text)."""
    if len(values) > limits.max_list_entries:
        raise InvalidArgument(
            f"{field} has {len(values)} entries; at most {limits.max_list_entries}",
            field=field,
            reason="TOO_MANY_ENTRIES",
        )
    if short:
        for i, v in enumerate(values):
            check_short(v, f"{field}[{i}]", limits)


def check_timestamp(value_ms: int, field: str, now_ms: int) -> None:
    """0 is allowed (the server's time is used); anything else must lie in the documented range."""
    if value_ms and not MIN_TIMESTAMP_MS <= value_ms <= now_ms + MAX_FUTURE_SKEW_MS:
        raise InvalidArgument(
            f"{field} {value_ms} is outside the accepted range: 0 (server time) or Unix milliseconds "
            f"from {MIN_TIMESTAMP_MS} (2000-01-01) to one day after the server's clock",
            field=field,
            reason="TIME_OUT_OF_RANGE",
        )


def message_bytes(m: Message) -> int:
    """What a message costs to store and to send back: every caller-given string, UTF-8 (ids, bounded by
    their own rule, aside)."""
    strings = [
        m.content,
        m.native_json,
        m.native_format,
        m.source_agent_id,
        m.participant_name,
        m.user_id,
        m.channel,
        m.visibility_group,
        *m.planning_steps,
        *m.invoked,
        *m.tool_call_ids,
        *m.metadata.keys(),
        *m.metadata.values(),
    ]
    return sum(len(s.encode()) for s in strings)


def check_batch_count(count: int, limits: Limits) -> None:
    """The batch's length alone: checked before its messages are converted, so 100,000 tiny ones are
    refused at once rather than after a second and a half of the event loop building them."""
    if not count:
        raise InvalidArgument("messages must not be empty", field="messages", reason="REQUIRED")
    if count > limits.max_batch_messages:
        raise ResourceExhausted(
            f"batch has {count} messages; at most {limits.max_batch_messages} per call",
            field="messages",
            reason="BATCH_TOO_LARGE",
        )


def check_batch(messages: list[Message], limits: Limits, now_ms: int) -> None:
    """Validates a batch before anything is written. Raises on the first bad message."""
    check_batch_count(len(messages), limits)
    total = 0
    seen: set[str] = set()
    for i, m in enumerate(messages):
        f = f"messages[{i}]"
        check_id(m.message_id, f"{f}.message_id", required=False)
        if m.message_id:
            if m.message_id in seen:
                raise InvalidArgument(
                    f"{f}.message_id {m.message_id!r} appears twice in the batch",
                    field=f"{f}.message_id",
                    reason="DUPLICATE_ID",
                )
            seen.add(m.message_id)
        _check_kinds(m, f)
        total += _check_message(m, f, limits, now_ms)
    if total > limits.max_batch_bytes:
        raise ResourceExhausted(
            f"batch is {total} bytes; the limit is {limits.max_batch_bytes}",
            field="messages",
            reason="BATCH_TOO_LARGE",
        )


def _check_kinds(m: Message, f: str) -> None:
    """The message's role and visibility are known, with what its visibility needs."""
    if m.role not in Role or m.role == Role.UNSPECIFIED:
        raise InvalidArgument(
            f"{f}.role must be one of user, assistant, system, tool, developer",
            field=f"{f}.role",
            reason="UNKNOWN_VALUE",
        )
    if m.visibility not in VisibilityKind:
        raise InvalidArgument(
            f"{f}.visibility is not a known visibility kind",
            field=f"{f}.visibility",
            reason="UNKNOWN_VALUE",
        )
    if m.visibility == VisibilityKind.GROUP and not m.visibility_group:
        raise InvalidArgument(
            f"{f}.visibility_group is required for group visibility",
            field=f"{f}.visibility_group",
            reason="REQUIRED",
        )
    if m.visibility == VisibilityKind.AGENT and not m.source_agent_id:
        raise InvalidArgument(
            f"{f}.source_agent_id is required for agent-private visibility",
            field=f"{f}.source_agent_id",
            reason="REQUIRED",
        )


def _check_message(m: Message, f: str, limits: Limits, now_ms: int) -> int:
    """Size, content, native object and short fields of one message; returns its size in bytes."""
    size = message_bytes(m)
    if size > limits.max_message_bytes:
        raise ResourceExhausted(
            f"{f} is {size} bytes; the limit is {limits.max_message_bytes} (content, native object, "
            "lists and metadata)",
            field=f,
            reason="MESSAGE_TOO_LARGE",
        )
    if not m.content and not m.native_json and not m.tool_call_ids:
        raise InvalidArgument(
            f"{f} has no content, native object or tool call", field=f, reason="EMPTY_MESSAGE"
        )
    if m.native_json:
        if not m.native_format:
            raise InvalidArgument(
                f"{f}.native.format is required with native.json",
                field=f"{f}.native.format",
                reason="REQUIRED",
            )
        try:
            native = orjson.loads(m.native_json)
        except orjson.JSONDecodeError as exc:
            raise InvalidArgument(
                f"{f}.native.json is not valid JSON: {exc}",
                field=f"{f}.native.json",
                reason="INVALID_JSON",
            ) from exc
        if json_depth(native) > MAX_NATIVE_DEPTH:
            raise InvalidArgument(
                f"{f}.native.json nests deeper than {MAX_NATIVE_DEPTH} levels",
                field=f"{f}.native.json",
                reason="TOO_DEEP",
            )
    for name in ("source_agent_id", "participant_name", "user_id", "channel", "visibility_group"):
        check_short(getattr(m, name), f"{f}.{name}", limits)
    check_metadata(m.metadata, f"{f}.metadata", limits)
    check_list(m.planning_steps, f"{f}.planning_steps", limits, short=False)  # free text
    check_list(m.invoked, f"{f}.invoked", limits)
    check_list(m.tool_call_ids, f"{f}.tool_call_ids", limits)
    check_timestamp(m.created_at_ms, f"{f}.created_at_unix_ms", now_ms)
    return size
