"""Long-term memory: the LanceDB table, the memory service and its maintenance (the embedder:
``wiring/embedding.py``)."""

from __future__ import annotations

from pathlib import Path

from .. import telemetry
from ..config import LtmSettings
from ..embedding import Embedder
from ..extraction import find_pii
from ..infra.redis_pool import RedisClient
from ..keyspace import KeySpace
from ..ltm import LanceMemoryStore, MemoryMaintenance, MemoryService, MemoryTuning
from ..ltm.history import HistoryLog
from ..ltm.redis_state import LtmVersions
from ..observability.domain import DomainMetrics
from ..sessions.leases import LeaseLock


async def open_store(
    s: LtmSettings,
    *,
    data_dir: str,
    ndims: int,
    redis: RedisClient,
    keys: KeySpace,
    metrics: DomainMetrics,
) -> telemetry.MeteredLanceStore:
    # Every sidecar on this Redis prefix shares the table: one at a time compacts or erases it.
    return await telemetry.MeteredLanceStore.open_metered(
        metrics,
        s.ltm_uri or str(Path(data_dir) / "ltm"),
        ndims,
        cache_mb=s.ltm_cache_mb,
        lock=LeaseLock(redis, keys.ltm_lock()),
        read_consistency_s=s.ltm_read_consistency_seconds,
    )


def memory_service(
    s: LtmSettings,
    store: LanceMemoryStore,
    embedder: Embedder,
    *,
    versions: LtmVersions,
    history: HistoryLog,
) -> MemoryService:
    """The service over the table. ``versions``: every LTM write bumps the user's version in Redis, so
    cached profiles and this (or another) sidecar's LanceDB view are checked against it on the next
    assembly."""
    policy = MemoryTuning(
        max_items_per_agent=s.ltm_max_items_per_agent,
        max_episodes_per_agent=s.ltm_max_episodes_per_agent,
        duplicate_similarity=s.ltm_duplicate_similarity,
        profile_max_items=s.ltm_profile_max_items,
        expansion_weight=MemoryTuning().expansion_weight if s.ltm_recall_expansion else 0.0,
    )
    return MemoryService(
        store,
        embedder,
        policy,
        guard=find_pii,
        usage_flush_interval_s=s.ltm_usage_flush_seconds,
        on_change=versions.bump,
        history=history,
        hot_index_mb=s.ltm_hot_index_mb,
        versions=versions,
    )


def maintenance(s: LtmSettings, service: MemoryService) -> MemoryMaintenance:
    """Compaction, index builds and pruning of the table; built, not started."""
    return MemoryMaintenance(
        service,
        optimize_interval_s=s.ltm_optimize_interval_seconds,
        optimize_after_writes=s.ltm_optimize_after_writes,
        prune_interval_s=s.ltm_prune_interval_seconds,
        vector_index_min_rows=s.ltm_vector_index_min_rows,
    )
