"""Named snapshots of the memory a view of a user can read: take, list, diff against now, restore.

A snapshot holds every item the taker could read (retired ones too: a bad extraction batch retires good
facts, and restoring must bring them back), and remembers the view it was taken with (agent and
groups). Only that view may diff or restore it, and only while the caller's groups still cover the
snapshot's: so a restore writes back only items the caller may read today, deletes only items it may
read, and no snapshot can widen what a caller sees. Every write a restore makes is journaled with
reason RESTORE, like any other change.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import orjson

from ..errors import NotFound, PermissionDenied
from . import filters
from .history import Change, ChangeReason, HistoryLog, SnapshotBackend, item_bytes, item_from_bytes
from .ingest import embedding_text
from .model import MemoryItem, Visibility
from .service import MemoryService, readable

_DELETE_BATCH = 1000
# What a diff compares: the item's meaning and state, not its usage counters (which move on every read).
_COMPARED = (
    "agent_id",
    "scope",
    "group",
    "kind",
    "content",
    "keywords",
    "slot",
    "importance",
    "superseded_by",
    "valid_until_ms",
    "metadata",
)


class DiffKind(enum.IntEnum):
    """Values match ``memlane.v1.MemoryDiffKind``."""

    ADDED = 1
    REMOVED = 2
    CHANGED = 3


@dataclass(frozen=True, slots=True)
class Diff:
    memory_id: str
    kind: DiffKind
    before: MemoryItem | None  # as the snapshot holds it
    after: MemoryItem | None  # as it is now


@dataclass(slots=True)
class SnapshotInfo:
    snapshot_id: str
    user_id: str
    agent_id: str
    groups: list[str] = field(default_factory=list)
    created_at_ms: int = 0
    item_count: int = 0
    note: str = ""


def _differs(a: MemoryItem, b: MemoryItem) -> bool:
    return any(getattr(a, name) != getattr(b, name) for name in _COMPARED)


def diff(snapshot: dict[str, MemoryItem], current: dict[str, MemoryItem]) -> list[Diff]:
    out = [Diff(i, DiffKind.ADDED, None, current[i]) for i in sorted(current.keys() - snapshot.keys())]
    out += [Diff(i, DiffKind.REMOVED, snapshot[i], None) for i in sorted(snapshot.keys() - current.keys())]
    out += [
        Diff(i, DiffKind.CHANGED, snapshot[i], current[i])
        for i in sorted(snapshot.keys() & current.keys())
        if _differs(snapshot[i], current[i])
    ]
    return out


class MemorySnapshots:
    def __init__(self, memory: MemoryService, backend: SnapshotBackend, history: HistoryLog | None) -> None:
        self._memory = memory
        self._backend = backend
        self._history = history

    async def take(self, who: Visibility, snapshot_id: str, note: str = "") -> SnapshotInfo:
        now = self._memory.now_ms()
        await self._backend.reserve(who.user_id, snapshot_id, now)
        items = await self._current(who)
        info = SnapshotInfo(
            snapshot_id, who.user_id, who.agent_id, sorted(set(who.groups)), now, len(items), note[:1000]
        )
        meta = orjson.dumps(
            {
                "snapshot_id": info.snapshot_id,
                "user_id": info.user_id,
                "agent_id": info.agent_id,
                "groups": info.groups,
                "created_at_ms": info.created_at_ms,
                "item_count": info.item_count,
                "note": info.note,
            }
        )
        await self._backend.write(
            who.user_id, snapshot_id, meta, {i: item_bytes(v) for i, v in items.items()}
        )
        return info

    async def list_snapshots(self, who: Visibility) -> list[SnapshotInfo]:
        infos = [SnapshotInfo(**orjson.loads(m)) for m in await self._backend.metas(who.user_id)]
        return [s for s in infos if s.agent_id == who.agent_id]

    async def diff(self, who: Visibility, snapshot_id: str) -> tuple[SnapshotInfo, list[Diff]]:
        info = await self._usable(who, snapshot_id)
        raw = await self._backend.items(who.user_id, snapshot_id)
        snapshot = {i: item_from_bytes(v) for i, v in raw.items()}
        # Compared within the snapshot's own view: items the caller reads only through a group it joined
        # since were never part of the snapshot, so a restore must not take them for additions.
        view = Visibility(who.user_id, info.agent_id, info.groups)
        return info, diff(snapshot, await self._current(view))

    async def restore(self, who: Visibility, snapshot_id: str) -> list[Diff]:
        """Puts back what the snapshot holds; returns the diff it undid."""
        _, changes = await self.diff(who, snapshot_id)
        store = self._memory.store
        doomed = [d.memory_id for d in changes if d.kind is DiffKind.ADDED]
        for start in range(0, len(doomed), _DELETE_BATCH):
            batch = filters.with_ids(doomed[start : start + _DELETE_BATCH])
            await store.delete(filters.owned_by(who.user_id) & batch)
        back = [d.before for d in changes if d.before is not None]
        await self._with_vectors(back, {d.memory_id: d.after for d in changes if d.after is not None})
        await store.upsert(back)
        if self._history is not None:
            journal = [
                Change(d.after, ChangeReason.RESTORE, deleted=True)
                for d in changes
                if d.after and not d.before
            ]
            journal += [Change(item, ChangeReason.RESTORE) for item in back]
            await self._history.record(who.user_id, who.agent_id, journal)
        await self._memory.changed(who.user_id)
        return changes

    async def delete(self, who: Visibility, snapshot_id: str) -> None:
        await self._usable(who, snapshot_id)
        await self._backend.delete(who.user_id, snapshot_id)

    async def _usable(self, who: Visibility, snapshot_id: str) -> SnapshotInfo:
        raw = await self._backend.meta(who.user_id, snapshot_id)
        info = SnapshotInfo(**orjson.loads(raw)) if raw is not None else None
        if info is None or info.agent_id != who.agent_id:
            raise NotFound(f"snapshot {snapshot_id!r} not found")
        missing = sorted(set(info.groups) - set(who.groups))
        if missing:
            raise PermissionDenied(
                f"the snapshot covers group {missing[0]!r}, which the caller does not present"
            )
        return info

    async def _current(self, who: Visibility) -> dict[str, MemoryItem]:
        return {i.id: i for i in await self._memory.store.fetch(readable(who))}

    async def _with_vectors(self, items: list[MemoryItem], now: dict[str, MemoryItem]) -> None:
        """Vectors for the items to write back: the stored one where the text is unchanged, else new."""
        same = [i for i in items if i.id in now and _text(now[i.id]) == _text(i)]
        if same:
            where = filters.owned_by(self._user(items)) & filters.with_ids([i.id for i in same])
            rows = await self._memory.store.fetch(where, with_vector=True)
            vectors = {r.id: r.vector for r in rows}
            for item in same:
                item.vector = vectors.get(item.id, [])
        fresh = [i for i in items if not i.vector]
        if fresh:
            embedded = await self._memory.embedder.embed([_text(i) for i in fresh])
            for item, vector in zip(fresh, embedded, strict=True):
                item.vector = vector.tolist()

    @staticmethod
    def _user(items: list[MemoryItem]) -> str:
        return items[0].user_id


def _text(item: MemoryItem) -> str:
    return embedding_text(item.content, item.keywords)
