"""The archive's Parquet tables: their schemas, and the rows one archive part becomes.

Kept apart from the store (``archive.py``) because the schemas are a contract with every reader of the
archive (DuckDB, Spark, Athena, ``memlane`` export), while the store is about paths and filesystems.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from ..sessions.model import Message, Session

_TS = pa.timestamp("ms", tz="UTC")
_STRINGS = pa.list_(pa.string())

TRANSCRIPT_SCHEMA = pa.schema(
    [
        ("session_id", pa.string()),
        ("user_id", pa.string()),
        ("agent_id", pa.string()),
        ("seq", pa.int64()),
        ("message_id", pa.string()),
        ("role", pa.string()),
        ("content", pa.string()),
        ("created_at", _TS),
        ("token_count", pa.int32()),
        ("source_agent_id", pa.string()),
        ("participant_name", pa.string()),
        ("message_user_id", pa.string()),
        ("message_channel", pa.string()),
        ("native_format", pa.string()),
        ("native_json", pa.string()),
        ("planning_steps", _STRINGS),
        ("invoked", _STRINGS),
        ("tool_call_ids", _STRINGS),
        ("metadata", pa.map_(pa.string(), pa.string())),
        ("visibility", pa.string()),
        ("visibility_group", pa.string()),
    ]
)
CHECKPOINT_SCHEMA = pa.schema(
    [
        ("session_id", pa.string()),
        ("user_id", pa.string()),
        ("namespace", pa.string()),
        ("checkpoint_id", pa.string()),
        ("record_json", pa.string()),  # checkpoints/store.py: to_record / from_record
    ]
)
SUMMARY_SCHEMA = pa.schema(
    [
        ("session_id", pa.string()),
        ("user_id", pa.string()),
        ("agent_id", pa.string()),
        ("status", pa.string()),
        ("created_at", _TS),
        ("ended_at", _TS),
        ("first_seq", pa.int64()),
        ("last_seq", pa.int64()),
        ("summary", pa.string()),
        ("summary_through_seq", pa.int64()),
        ("message_count", pa.int64()),
        ("token_total", pa.int64()),
        ("model", pa.string()),
        ("group", pa.string()),
        ("participants", _STRINGS),
        ("tags", _STRINGS),
        ("metadata", pa.map_(pa.string(), pa.string())),
        ("promoted_memory_ids", _STRINGS),
        ("policy_json", pa.string()),
    ]
)
TRACE_SCHEMA = pa.schema(
    [
        ("session_id", pa.string()),
        ("trace_id", pa.string()),
        ("created_at", _TS),
        ("trace_json", pa.string()),
    ]
)


@dataclass(slots=True)
class ArchivePart:
    """What one archive write holds: messages ``first_seq..last_seq`` and the session as it ended."""

    session: Session
    messages: list[Message]
    traces: list[tuple[str, int, str]]  # (trace_id, created_at_ms, JSON)
    promoted_ids: list[str]
    ended_at_ms: int
    first_seq: int
    last_seq: int


def ts_ms(ts: Any) -> int:
    if ts is None:
        return 0
    if isinstance(ts, dt.datetime):
        return int(ts.timestamp() * 1000)
    return int(ts)


def ms_dt(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def transcript_table(part: ArchivePart) -> pa.Table:
    """One row per message of the part."""
    s, msgs = part.session, part.messages
    return pa.Table.from_pydict(
        {
            "session_id": [s.session_id] * len(msgs),
            "user_id": [s.user_id] * len(msgs),
            "agent_id": [s.agent_id] * len(msgs),
            "seq": [m.seq for m in msgs],
            "message_id": [m.message_id for m in msgs],
            "role": [m.role.name.lower() for m in msgs],
            "content": [m.content for m in msgs],
            "created_at": [ms_dt(m.created_at_ms) for m in msgs],
            "token_count": [m.token_count for m in msgs],
            "source_agent_id": [m.source_agent_id for m in msgs],
            "participant_name": [m.participant_name for m in msgs],
            "message_user_id": [m.user_id for m in msgs],
            "message_channel": [m.channel for m in msgs],
            "native_format": [m.native_format for m in msgs],
            "native_json": [m.native_json for m in msgs],
            "planning_steps": [m.planning_steps for m in msgs],
            "invoked": [m.invoked for m in msgs],
            "tool_call_ids": [m.tool_call_ids for m in msgs],
            "metadata": [list(m.metadata.items()) for m in msgs],
            "visibility": [m.visibility.name.lower() for m in msgs],
            "visibility_group": [m.visibility_group for m in msgs],
        },
        schema=TRANSCRIPT_SCHEMA,
    )


def summary_table(part: ArchivePart) -> pa.Table:
    """One row: the session as it ended, with its summary and policy."""
    s = part.session
    return pa.Table.from_pydict(
        {
            "session_id": [s.session_id],
            "user_id": [s.user_id],
            "agent_id": [s.agent_id],
            "status": [s.status.name.lower()],
            "created_at": [ms_dt(s.created_at_ms)],
            "ended_at": [ms_dt(part.ended_at_ms)],
            "first_seq": [part.first_seq],
            "last_seq": [part.last_seq],
            "summary": [s.summary.text],
            "summary_through_seq": [s.summary.through_seq],
            "message_count": [s.message_count],
            "token_total": [s.token_total],
            "model": [s.model],
            "group": [s.group],
            "participants": [s.participants],
            "tags": [s.tags],
            "metadata": [list(s.metadata.items())],
            "promoted_memory_ids": [part.promoted_ids],
            "policy_json": [orjson.dumps(s.policy.to_record() if s.policy else {}).decode()],
        },
        schema=SUMMARY_SCHEMA,
    )


def trace_table(part: ArchivePart) -> pa.Table:
    """One row per turn trace of the part."""
    s = part.session
    return pa.Table.from_pydict(
        {
            "session_id": [s.session_id] * len(part.traces),
            "trace_id": [t[0] for t in part.traces],
            "created_at": [ms_dt(t[1]) for t in part.traces],
            "trace_json": [t[2] for t in part.traces],
        },
        schema=TRACE_SCHEMA,
    )
