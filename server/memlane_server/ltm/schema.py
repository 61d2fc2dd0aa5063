"""The LanceDB table layout of memory items and the row <-> ``MemoryItem`` conversions."""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa

from ..memory_kinds import MemoryKind, MemoryScope
from .filters import KEY_COLUMNS, key
from .model import MemoryItem

TABLE_NAME = "memories"
# Columns without the vector: what list/get/profile read, so they never pay for 384 floats a row.
META_COLUMNS = [
    "id",
    "user_id",
    "agent_id",
    "scope",
    "group",
    "kind",
    "content",
    "keywords",
    "slot",
    "importance",
    "usage_count",
    "useful_count",
    "wrong_count",
    "last_used_at_ms",
    "created_at_ms",
    "updated_at_ms",
    "occurred_at_ms",
    "source_session_id",
    "source_message_ids",
    "channel",
    "superseded_by",
    "valid_until_ms",
    "metadata_json",
]


def table_schema(ndims: int) -> pa.Schema:
    return pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("user_id", pa.string(), nullable=False),
            pa.field("agent_id", pa.string()),
            pa.field("scope", pa.string()),
            pa.field("group", pa.string()),
            pa.field("kind", pa.string()),
            pa.field("content", pa.string()),
            # What the full-text index sees: content plus keywords (and an episode's date), so a
            # query can hit words the item implies but does not spell out.
            pa.field("search_text", pa.string()),
            pa.field("keywords", pa.list_(pa.string())),
            pa.field("slot", pa.string()),
            pa.field("importance", pa.float32()),
            pa.field("usage_count", pa.int64()),
            pa.field("useful_count", pa.int64()),
            pa.field("wrong_count", pa.int64()),
            pa.field("last_used_at_ms", pa.int64()),
            pa.field("created_at_ms", pa.int64()),
            pa.field("updated_at_ms", pa.int64()),
            pa.field("occurred_at_ms", pa.int64()),
            pa.field("source_session_id", pa.string()),
            pa.field("source_message_ids", pa.list_(pa.string())),
            pa.field("channel", pa.string()),
            pa.field("superseded_by", pa.string()),
            pa.field("valid_until_ms", pa.int64()),
            pa.field("metadata_json", pa.string()),
            pa.field("vector", pa.list_(pa.float32(), ndims)),
            # Digests of the string columns that predicates test (see ``filters``): never a caller
            # string in a predicate.
            *(pa.field(k, pa.string(), nullable=False) for k in KEY_COLUMNS.values()),
        ]
    )


def search_text(item: MemoryItem) -> str:
    return " ".join([item.content, *item.keywords])


def to_row(item: MemoryItem) -> dict[str, Any]:
    row = _value_row(item)
    row.update({k: key(row[column] or "") for column, k in KEY_COLUMNS.items()})
    return row


def _value_row(item: MemoryItem) -> dict[str, Any]:
    return {
        "id": item.id,
        "user_id": item.user_id,
        "agent_id": item.agent_id,
        "scope": item.scope.value,
        "group": item.group,
        "kind": item.kind.value,
        "content": item.content,
        "search_text": search_text(item),
        "keywords": list(item.keywords),
        "slot": item.slot,
        "importance": float(item.importance),
        "usage_count": item.usage_count,
        "useful_count": item.useful_count,
        "wrong_count": item.wrong_count,
        "last_used_at_ms": item.last_used_at_ms,
        "created_at_ms": item.created_at_ms,
        "updated_at_ms": item.updated_at_ms,
        "occurred_at_ms": item.occurred_at_ms,
        "source_session_id": item.source_session_id,
        "source_message_ids": list(item.source_message_ids),
        "channel": item.channel,
        "superseded_by": item.superseded_by,
        "valid_until_ms": item.valid_until_ms,
        "metadata_json": orjson.dumps(item.metadata).decode() if item.metadata else "",
        "vector": list(item.vector),
    }


def from_row(row: dict[str, Any]) -> MemoryItem:
    meta = row.get("metadata_json") or ""
    vector = row.get("vector")
    return MemoryItem(
        id=row["id"],
        user_id=row["user_id"],
        agent_id=row.get("agent_id") or "",
        scope=MemoryScope(row.get("scope") or MemoryScope.USER.value),
        kind=MemoryKind(row.get("kind") or MemoryKind.FACT.value),
        content=row.get("content") or "",
        keywords=list(row.get("keywords") or []),
        slot=row.get("slot") or "",
        group=row.get("group") or "",
        importance=float(row.get("importance") or 0.0),
        usage_count=int(row.get("usage_count") or 0),
        useful_count=int(row.get("useful_count") or 0),
        wrong_count=int(row.get("wrong_count") or 0),
        last_used_at_ms=int(row.get("last_used_at_ms") or 0),
        created_at_ms=int(row.get("created_at_ms") or 0),
        updated_at_ms=int(row.get("updated_at_ms") or 0),
        occurred_at_ms=int(row.get("occurred_at_ms") or 0),
        source_session_id=row.get("source_session_id") or "",
        source_message_ids=list(row.get("source_message_ids") or []),
        channel=row.get("channel") or "",
        superseded_by=row.get("superseded_by") or "",
        valid_until_ms=int(row.get("valid_until_ms") or 0),
        metadata=dict(orjson.loads(meta)) if meta else {},
        vector=[float(x) for x in vector] if vector is not None else [],
    )
