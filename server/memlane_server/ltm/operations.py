"""Operations over a user's stored memories on top of MemoryService: merging items, snapshots (export, diff,
restore) and the periodic maintenance of the table.

Merging items an operator judged to say one thing (MergeMemories): the first item is kept and takes
every source's provenance, the others are superseded by it, exactly as a contradiction retires an older
item at ingest, so recall, audit, export and erasure treat them alike.

Named snapshots of the memory a view of a user can read: take, list, diff against now, restore.

A snapshot holds every item the taker could read (retired ones too: a bad extraction batch retires good
facts, and restoring must bring them back), and remembers the view it was taken with (agent and
groups). Only that view may diff or restore it, and only while the caller's groups still cover the
snapshot's: so a restore writes back only items the caller may read today, deletes only items it may
read, and no snapshot can widen what a caller sees. Every write a restore makes is journaled with
reason RESTORE, like any other change.

Background upkeep of the memory table: optimize (compaction, index refresh, version cleanup),
the vector index once the table is large, and the scheduled pruning job.

Every ``add``/``update`` makes a table version and leaves new rows outside the indexes until the next
optimize; doing that on a timer keeps writes cheap and searches fast.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass, field, replace

import orjson

from ..errors import InvalidArgument, NotFound, PermissionDenied
from ..infra.periodic import Periodic
from ..memory_kinds import MemoryKind, MemoryScope
from . import filters
from .core import canonical_slot
from .history import Change, ChangeReason, HistoryLog, SnapshotBackend, item_bytes, item_from_bytes
from .ingest import SESSIONS_KEY, clamp, clean_keywords, embedding_text, fold_provenance
from .model import MemoryItem, Visibility
from .service import MemoryService, readable, reads

log = logging.getLogger(__name__)
MAX_MERGE = 50  # items one call may fold together: an operator's fix, not a bulk rewrite


class MemoryMerge:
    """Beside ``MemoryService`` (as snapshots are): it writes through the service's store, embedder and
    journal, and announces the change the same way."""

    def __init__(self, memory: MemoryService) -> None:
        self._memory = memory

    async def merge(
        self,
        who: Visibility,
        memory_ids: list[str],
        *,
        content: str = "",
        kind: MemoryKind | None = None,
        slot: str = "",
    ) -> tuple[MemoryItem, list[str]]:
        """Returns the kept item and the ids it superseded. A merge already done (the others superseded by
        the first) returns the kept item without writing again."""
        if not 2 <= len(memory_ids) <= MAX_MERGE:
            raise InvalidArgument(f"memory_ids must name between 2 and {MAX_MERGE} items")
        if len(set(memory_ids)) != len(memory_ids):
            raise InvalidArgument("memory_ids names an item twice")
        m = self._memory
        text = m.check_content(content) if content.strip() else ""
        await m.freshness.current(who.user_id)
        where = readable(who) & filters.with_ids(memory_ids)
        found = {i.id: i for i in await m.store.fetch(where, with_vector=True, limit=len(memory_ids))}
        missing = [m for m in memory_ids if m not in found]
        if missing:
            raise NotFound(f"memory {missing[0]} not found")
        kept, others = found[memory_ids[0]], [found[m] for m in memory_ids[1:]]
        for n, other in enumerate(others, start=1):
            if _audience(other) != _audience(kept):
                raise InvalidArgument(
                    f"memory_ids[{n}]: memory {other.id} is {_audience_words(other)}, memory {kept.id}"
                    f" is {_audience_words(kept)}: a merge keeps each item's audience (change the"
                    " scope with UpdateMemory first to publish it)",
                    field=f"memory_ids[{n}]",
                )
        now = m.now_ms()
        if all(o.superseded_by == kept.id for o in others) and not (text or kind or slot):
            return replace(kept, vector=[]), [o.id for o in others]  # a retry of a merge that is done
        retired = [i for i in (kept, *others) if not i.is_active(now) and i.superseded_by != kept.id]
        if retired:
            raise InvalidArgument(f"memory {retired[0].id} is retired (superseded or marked wrong)")
        _fold(kept, [o for o in others if o.superseded_by != kept.id], m.policy.max_source_ids)
        kept.content = text or kept.content
        kept.kind = kind or kept.kind
        kept.slot = canonical_slot(slot) or kept.slot
        kept.updated_at_ms = now
        for o in others:
            o.superseded_by = kept.id
            o.valid_until_ms = now
            o.updated_at_ms = now
        # Rows are written whole (upsert): the others keep their vectors, the kept item's text and
        # keywords may have changed, so it is embedded again.
        kept.vector = (await m.embedder.embed([embedding_text(kept.content, kept.keywords)]))[0].tolist()
        await m.store.upsert([kept, *others])
        if m.history is not None:
            changes = [Change(replace(kept, vector=[]), ChangeReason.MERGE)]
            changes += [Change(replace(o, vector=[]), ChangeReason.SUPERSEDE) for o in others]
            await m.history.record(who.user_id, who.agent_id, changes)
        await m.changed(who.user_id)
        return replace(kept, vector=[]), [o.id for o in others]


def _audience(item: MemoryItem) -> tuple[MemoryScope, str]:
    """Who reads an item: every agent of the user (user and shared scope alike), one agent, one group.
    A merge folds the sources' words and provenance into the kept item, so all must share it: a
    private or group item folded into a user-wide one would show its keywords to every agent."""
    if item.scope is MemoryScope.AGENT:
        return MemoryScope.AGENT, item.agent_id
    if item.scope is MemoryScope.GROUP:
        return MemoryScope.GROUP, item.group
    return MemoryScope.USER, ""


def _audience_words(item: MemoryItem) -> str:
    scope, whose = _audience(item)
    return {
        MemoryScope.AGENT: f"private to agent {whose!r}",
        MemoryScope.GROUP: f"for group {whose!r}",
    }.get(scope, "for every agent of the user")


def _fold(kept: MemoryItem, others: list[MemoryItem], max_ids: int) -> None:
    """The sources' provenance and standing into the kept item: message ids and sessions accumulate
    (oldest first, as ingest's merge keeps them), keywords join, importance is the highest, the counts
    add up; the earliest time the thing happened stays."""
    for o in others:
        kept.keywords = clean_keywords([*kept.keywords, *o.keywords])
        kept.importance = clamp(max(kept.importance, o.importance))
        kept.usage_count += o.usage_count
        kept.useful_count += o.useful_count
        kept.last_used_at_ms = max(kept.last_used_at_ms, o.last_used_at_ms)
        if o.occurred_at_ms and (not kept.occurred_at_ms or o.occurred_at_ms < kept.occurred_at_ms):
            kept.occurred_at_ms = o.occurred_at_ms
        kept.source_session_id = kept.source_session_id or o.source_session_id
    sessions = [
        s for o in others for s in (*o.metadata.get(SESSIONS_KEY, "").split(","), o.source_session_id)
    ]
    fold_provenance(kept, sessions, [i for o in others for i in o.source_message_ids], max_ids)


# --- Named snapshots of the memory a view of a user can read: take, list, diff against now, restore.

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
        """Puts back what the snapshot holds; returns the diff it undid.

        Only rows of the restorer are written: an item of the snapshot outside its view (another
        user's, another agent's private one, a group it does not cover: only a forged or imported
        snapshot holds one) and an item whose id another user holds now (its own item, deleted since,
        whose client-chosen id was then taken) are skipped, and absent from the answer. Skipped, not
        refused: a snapshot is the user's undo, and one id taken by someone else must not make the
        rest of it impossible; refusing would tell no more about the id than skipping does."""
        info, changes = await self.diff(who, snapshot_id)
        view = Visibility(who.user_id, info.agent_id, info.groups)
        store = self._memory.store
        back_ids = [d.memory_id for d in changes if d.before is not None]
        skipped = {d.memory_id for d in changes if d.before is not None and not reads(view, d.before)}
        skipped |= await store.held_by_others(who.user_id, back_ids)
        if skipped:
            log.info("restore of a snapshot: %d item(s) skipped (not the restorer's to write)", len(skipped))
            changes = [d for d in changes if d.memory_id not in skipped]
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
            where = filters.owned_by(items[0].user_id) & filters.with_ids([i.id for i in same])
            rows = await self._memory.store.fetch(where, with_vector=True)
            vectors = {r.id: r.vector for r in rows}
            for item in same:
                item.vector = vectors.get(item.id, [])
        fresh = [i for i in items if not i.vector]
        if fresh:
            embedded = await self._memory.embedder.embed([_text(i) for i in fresh])
            for item, vector in zip(fresh, embedded, strict=True):
                item.vector = vector.tolist()


def _text(item: MemoryItem) -> str:
    return embedding_text(item.content, item.keywords)


# --- Background upkeep of the memory table: optimize (compaction, index refresh, version cleanup),


class MemoryMaintenance:
    def __init__(
        self,
        service: MemoryService,
        *,
        optimize_interval_s: float,  # these four from the settings (wiring/), which hold the defaults
        prune_interval_s: float,
        vector_index_min_rows: int,
        optimize_after_writes: int,
        check_interval_s: float = 5.0,
    ) -> None:
        self._service = service
        self._optimize_interval = optimize_interval_s
        self._optimize_after_writes = optimize_after_writes
        self._check_interval = min(check_interval_s, optimize_interval_s)
        self._prune_interval = prune_interval_s
        self._vector_index_min_rows = vector_index_min_rows
        self._last_prune = self._last_optimize = time.monotonic()
        self._loop = Periodic("ltm-maintenance", self._tick, self._check_interval)

    def start(self) -> None:
        self._loop.start()

    async def run_once(self, *, prune: bool = True) -> None:
        store = self._service.store
        await self._service.flush_usage()
        if prune:
            report = await self._service.prune()
            if report.total:
                log.info("pruned %d memories (%s)", report.total, report)
        await store.ensure_vector_index(self._vector_index_min_rows)
        if store.writes_since_optimize:
            await store.optimize()

    async def _tick(self) -> None:
        # A burst of writes (promotions) leaves many small fragments outside the full-text index, and
        # every search pays for scanning them: optimize early once enough writes piled up, not only
        # on the timer.
        now = time.monotonic()
        after = self._optimize_after_writes
        piled = after > 0 and self._service.store.writes_since_optimize >= after
        if not piled and now - self._last_optimize < self._optimize_interval:
            return
        due = now - self._last_prune >= self._prune_interval
        try:
            await self.run_once(prune=due)
        finally:  # a failed round (logged by Periodic) waits for the next interval like a good one
            self._last_optimize = time.monotonic()
            if due:
                self._last_prune = self._last_optimize

    async def close(self) -> None:
        await self._loop.stop()
