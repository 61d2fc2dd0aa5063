"""Versions of memory items, in one home: why an item changed, the journal ``MemoryService`` writes
every change to (``HistoryLog``, met by ``MemoryHistory``), its export, and the storage protocols
underneath (``JournalBackend``, ``SnapshotBackend``). Their Redis implementation
(``ltm/redis_state.py``) sees only encoded item documents; wiring puts the two together.

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


# A stored version as the journal backend returns it: (cursor, memory id, reason, actor, at ms, deleted,
# item document).
JournalRow = tuple[str, str, int, str, int, bool, bytes]


# A version read from an export, to journal again: (memory id, reason, actor, at ms, deleted, item document).
ImportedVersion = tuple[str, int, str, int, bool, bytes]


class JournalBackend(Protocol):
    """Where the journal's rows are kept, encoded."""

    async def import_entries(self, user_id: str, rows: Sequence[ImportedVersion]) -> int:
        """Journals exported versions at their own times, leaving out those held already."""
        ...

    async def append(
        self, user_id: str, actor: str, entries: Sequence[tuple[str, int, bool, bytes]]
    ) -> None: ...

    async def entries(
        self, user_id: str, memory_id: str, after: str, limit: int
    ) -> tuple[Sequence[JournalRow], str]: ...

    async def sizes(self, user_id: str) -> dict[str, int]:
        """Versions and snapshots kept for the user, by kind (for erasure's receipt)."""
        ...


class SnapshotBackend(Protocol):
    """Named snapshots of a user's items (raw item documents; ``meta`` is the snapshot's description)."""

    @property
    def max_snapshots(self) -> int:
        """How many snapshots one user may hold (``reserve`` refuses one more)."""
        ...

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


class HistoryBackend(JournalBackend, SnapshotBackend, Protocol):
    """Both, as one store keeps them (``ltm/redis_state.py RedisMemoryHistory``)."""


class MemoryHistory:
    """The ``HistoryLog`` over a backend, and a user's versions and snapshots as export records."""

    def __init__(self, backend: HistoryBackend) -> None:
        self._backend = backend

    @property
    def snapshots(self) -> SnapshotBackend:
        return self._backend

    async def import_versions(self, user_id: str, rows: Sequence[ImportedVersion]) -> int:
        """Versions from an export (ImportUserData), at the times they were made; returns how many were
        new."""
        return await self._backend.import_entries(user_id, rows)

    async def record(self, user_id: str, actor: str, changes: Sequence[Change]) -> None:
        rows = [(c.item.id, int(c.reason), c.deleted, item_bytes(c.item)) for c in changes]
        await self._backend.append(user_id, actor, rows)

    async def versions(
        self, user_id: str, memory_id: str, after: str, limit: int
    ) -> tuple[list[MemoryVersion], str]:
        rows, cursor = await self._backend.entries(user_id, memory_id, after, limit)
        return [_version(row) for row in rows], cursor

    async def sizes(self, user_id: str) -> dict[str, int]:
        return await self._backend.sizes(user_id)

    async def export(self, user_id: str) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        after = ""
        while True:
            page, after = await self.versions(user_id, "", after, 500)
            for v in page:
                record = orjson.loads(item_bytes(v.item))
                out.append(
                    (
                        "memory_version",
                        {
                            "memory_id": v.memory_id,
                            "reason": v.reason.name.lower(),
                            "changed_by": v.changed_by,
                            "changed_at_ms": v.changed_at_ms,
                            "deleted": v.deleted,
                            "item": record,
                        },
                    )
                )
            if not after:
                break
        for meta in await self._backend.metas(user_id):
            desc = orjson.loads(meta)
            items = await self._backend.items(user_id, desc["snapshot_id"])
            desc["items"] = [orjson.loads(raw) for _, raw in sorted(items.items())]
            out.append(("memory_snapshot", desc))
        return out


def _version(row: JournalRow) -> MemoryVersion:
    cursor, memory_id, reason, actor, at_ms, deleted, item = row
    return MemoryVersion(
        cursor=cursor,
        memory_id=memory_id,
        reason=ChangeReason(reason),
        changed_by=actor,
        changed_at_ms=at_ms,
        item=item_from_bytes(item),
        deleted=deleted,
    )
