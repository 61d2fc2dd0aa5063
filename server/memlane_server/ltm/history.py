"""Versions of memory items: why an item changed, the journal protocol ``MemoryService`` writes every
change to, and the storage protocol of snapshots. The Redis implementation of both lives with the other
Redis keys (``sessions/memory_history.py``); ltm only knows these protocols.

A version is the whole item as the change left it (for a deletion: as it was), minus its vector (derived
data, recomputed from content and keywords when a snapshot is restored).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from .model import MemoryItem
from .schema import from_row, to_row


class ChangeReason(enum.IntEnum):
    """Why an item changed. Values match ``memlane.v1.MemoryChangeReason``."""

    UNSPECIFIED = 0
    EXTRACTION = 1  # promoted from a session, or ExtractMemories
    CREATE = 2  # CreateMemory
    MERGE = 3  # a restatement folded into it
    SUPERSEDE = 4  # retired by a newer item
    FEEDBACK = 5
    EDIT = 6  # UpdateMemory
    DELETE = 7  # DeleteMemory
    PRUNE = 8  # a cap or the pruning job
    RESTORE = 9  # RestoreMemorySnapshot


@dataclass(frozen=True, slots=True)
class Change:
    item: MemoryItem
    reason: ChangeReason
    deleted: bool = False


@dataclass(frozen=True, slots=True)
class MemoryVersion:
    cursor: str  # position in the user's journal (a page token)
    memory_id: str
    reason: ChangeReason
    changed_by: str
    changed_at_ms: int
    item: MemoryItem
    deleted: bool


# Columns of a stored item that are not the user's words: the vector is derived, the digests too.
_DERIVED = {"vector", "search_text"}


def item_doc(item: MemoryItem) -> dict[str, Any]:
    return {k: v for k, v in to_row(item).items() if k not in _DERIVED and not k.endswith("_key")}


def item_bytes(item: MemoryItem) -> bytes:
    return orjson.dumps(item_doc(item))


def item_from_bytes(raw: bytes | str) -> MemoryItem:
    return from_row(orjson.loads(raw))


class HistoryLog(Protocol):
    """Where ``MemoryService`` journals changes. ``record`` is called after the change is written."""

    async def record(self, user_id: str, actor: str, changes: Sequence[Change]) -> None: ...

    async def versions(
        self, user_id: str, memory_id: str, after: str, limit: int
    ) -> tuple[list[MemoryVersion], str]:
        """Oldest first, from after the cursor ``after``; (page, cursor of the next page or "")."""
        ...


class SnapshotBackend(Protocol):
    """Named snapshots of a user's items (raw item documents; ``meta`` is the snapshot's description)."""

    async def reserve(self, user_id: str, snapshot_id: str, created_at_ms: int) -> None:
        """Claims the name (AlreadyExists if taken, ResourceExhausted over the per-user limit)."""
        ...

    async def write(self, user_id: str, snapshot_id: str, meta: bytes, items: dict[str, bytes]) -> None: ...

    async def meta(self, user_id: str, snapshot_id: str) -> bytes | None: ...

    async def items(self, user_id: str, snapshot_id: str) -> dict[str, bytes]: ...

    async def metas(self, user_id: str) -> list[bytes]:
        """Every complete snapshot's description, newest first."""
        ...

    async def delete(self, user_id: str, snapshot_id: str) -> bool: ...
