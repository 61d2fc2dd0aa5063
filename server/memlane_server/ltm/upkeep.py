"""Upkeep of the memory table (scheduled pruning, optimize) and per-user export and erasure."""

from __future__ import annotations

from dataclasses import dataclass

from ..memory_kinds import MemoryKind, MemoryScope
from . import filters
from .core import DELETE_BATCH, MemoryCore
from .history import Change, ChangeReason
from .model import MemoryItem
from .recall import prune_score
from .tuning import DAY_MS


@dataclass(slots=True)
class PruneReport:
    over_cap: int = 0
    unused: int = 0
    retired: int = 0

    @property
    def total(self) -> int:
        return self.over_cap + self.unused + self.retired


class MemoryUpkeep(MemoryCore):
    # ----------------------------------------------------------------------------------- upkeep

    async def prune(self, now_ms: int | None = None) -> PruneReport:
        """The scheduled pruning job: over-cap items, old never-used items, expired audit records."""
        now = self._clock() if now_ms is None else now_ms
        policy = self._policy
        report = PruneReport()
        all_items = await self._store.fetch_columns(None, _PRUNE_COLUMNS)
        items = [_prune_view(r) for r in all_items.to_pylist()]
        doomed: set[tuple[str, str]] = set()  # (user, id): a row is its user's, never another's of one id
        unused_before = now - int(policy.unused_ttl_days * DAY_MS)
        retired_before = now - int(policy.retired_retention_days * DAY_MS)
        groups: dict[tuple[str, str, bool], list[MemoryItem]] = {}
        for item in items:
            if not item.is_active(now):
                if item.valid_until_ms and item.valid_until_ms < retired_before:
                    doomed.add((item.user_id, item.id))
                    report.retired += 1
                continue
            if (
                item.usage_count == 0
                and item.created_at_ms < unused_before
                and item.importance < policy.unused_keep_importance
            ):
                doomed.add((item.user_id, item.id))
                report.unused += 1
                continue
            key = (item.user_id, item.agent_id, item.kind is MemoryKind.EPISODIC)
            groups.setdefault(key, []).append(item)
        for (_, _, episodic), members in groups.items():
            cap = policy.max_episodes_per_agent if episodic else policy.max_items_per_agent
            if len(members) > cap:
                ranked = sorted(members, key=lambda i: (prune_score(i, now, policy), i.updated_at_ms))
                extra = ranked[: len(members) - cap]
                doomed.update((i.user_id, i.id) for i in extra)
                report.over_cap += len(extra)
        rows = sorted(doomed)
        for start in range(0, len(rows), DELETE_BATCH):
            batch = filters.owned_ids(rows[start : start + DELETE_BATCH])
            gone = await self._store.fetch(batch) if self._history is not None else []
            await self._store.delete(batch)
            for user_id in sorted({i.user_id for i in gone}):
                pruned = [Change(i, ChangeReason.PRUNE, deleted=True) for i in gone if i.user_id == user_id]
                await self._journal(user_id, "", pruned)
        await self._changed(*sorted({user_id for user_id, _ in doomed}), removed=True)
        return report

    async def optimize(self) -> None:
        await self._store.optimize()

    # ------------------------------------------------------------------- per-user export and erasure

    async def export_user(self, *user_ids: str) -> list[MemoryItem]:
        """Every item of the user, stored under any of ``user_ids`` (as ``erase_user``), retired ones
        included (an export hides nothing)."""
        return await self._store.fetch(filters.owned_by_any(list(user_ids)))

    async def erase_user(self, *user_ids: str) -> int:
        """Deletes the items of the user, stored under any of ``user_ids`` (the forms of one id, see
        ``ids.equivalent_forms``), so that no byte of them stays on disk (see ``LanceMemoryStore.erase``):
        one rewrite for them all. Returns how many items there were."""
        await self._usage.flush()  # a pending usage bump must not resurrect a row after the delete
        n = await self._store.erase(filters.owned_by_any(list(user_ids)))
        self._embedder.forget_cached()
        await self._changed(*user_ids, removed=True)
        return n


_PRUNE_COLUMNS = [
    "id",
    "user_id",
    "agent_id",
    "kind",
    "importance",
    "usage_count",
    "last_used_at_ms",
    "created_at_ms",
    "updated_at_ms",
    "occurred_at_ms",
    "superseded_by",
    "valid_until_ms",
]


def _prune_view(row: dict[str, object]) -> MemoryItem:
    def num(name: str) -> int:
        value = row.get(name)
        return int(value) if isinstance(value, int | float) else 0

    return MemoryItem(
        id=str(row["id"]),
        user_id=str(row["user_id"]),
        agent_id=str(row.get("agent_id") or ""),
        scope=MemoryScope.USER,
        kind=MemoryKind(str(row.get("kind") or MemoryKind.FACT.value)),
        content="",
        importance=float(row.get("importance") or 0.0),  # type: ignore[arg-type]
        usage_count=num("usage_count"),
        last_used_at_ms=num("last_used_at_ms"),
        created_at_ms=num("created_at_ms"),
        updated_at_ms=num("updated_at_ms"),
        occurred_at_ms=num("occurred_at_ms"),
        superseded_by=str(row.get("superseded_by") or ""),
        valid_until_ms=num("valid_until_ms"),
    )
