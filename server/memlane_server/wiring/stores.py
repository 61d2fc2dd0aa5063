"""Where the sidecar's data lives: the Redis-backed stores (``sessions/``: sessions, checkpoints,
procedures, versions, traces) and long-term memory (the LanceDB table, the memory service over it with its
``MemoryTuning``, and the table's maintenance; the embedder: ``wiring/embedding.py``)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .. import telemetry
from ..checkpoints.store import CheckpointStore
from ..config import LtmSettings, SessionSettings, Settings
from ..embedding import Embedder
from ..extraction import find_pii
from ..infra.redis_pool import RedisClient
from ..keyspace import KeySpace
from ..ltm import LanceMemoryStore, MemoryMaintenance, MemoryService, MemoryTuning
from ..ltm.history import HistoryLog, MemoryHistory
from ..ltm.redis_state import LtmVersions, RedisMemoryHistory
from ..ltm.tuning import EXPANSION_WEIGHT
from ..observability.domain import DomainMetrics
from ..procedures import Owner, ProcedureService
from ..procedures.store import ProcedureStore
from ..sessions.ending import EndState
from ..sessions.leases import LeaseLock
from ..sessions.limits import Limits
from ..sessions.model import Topology
from ..sessions.scripts import Durability
from ..sessions.store import SessionStore
from ..sessions.traces import TraceRecords
from ..tokens import TokenCounter


@dataclass(frozen=True, slots=True)
class Stores:
    keys: KeySpace
    limits: Limits  # what one call may send; the API and user import check batches against it too
    sessions: SessionStore
    checkpoints: CheckpointStore
    procedures: ProcedureService
    memory_history: MemoryHistory  # over RedisMemoryHistory
    traces: TraceRecords
    end_state: EndState


def session_limits(s: SessionSettings) -> Limits:
    """The configured batch bounds: AppendMessages, ExtractMemories and user import all take these."""
    return Limits(
        max_message_bytes=s.max_message_bytes,
        max_batch_messages=s.max_batch_messages,
        max_batch_bytes=s.max_batch_bytes,
    )


def build_stores(
    redis: RedisClient,
    tokens: TokenCounter,
    settings: Settings,
    *,
    executor: ThreadPoolExecutor,
    auto_approve: Callable[[Owner], bool],
) -> Stores:
    r, s = settings.redis, settings.sessions
    keys = KeySpace(r.key_prefix)
    limits = session_limits(s)
    sessions = SessionStore(
        redis,
        keys,
        tokens,
        limits=limits,
        default_ttl_seconds=s.session_ttl_seconds,
        default_topology=Topology[s.default_topology.upper()],
        executor=executor,
        durability=Durability(r.redis_wait_replicas, r.redis_wait_timeout_ms),
    )
    return Stores(
        keys=keys,
        limits=limits,
        sessions=sessions,
        checkpoints=CheckpointStore(redis, keys),
        procedures=ProcedureService(ProcedureStore(redis, keys), auto_approve=auto_approve, guard=find_pii),
        memory_history=MemoryHistory(
            RedisMemoryHistory(
                redis,
                keys,
                max_versions=settings.ltm.ltm_versions_max_per_user,
                max_snapshots=settings.ltm.ltm_snapshots_max_per_user,
            )
        ),
        traces=TraceRecords(redis, keys, settings.context.context_max_traces_per_session),
        end_state=EndState(redis, keys),
    )


# --- long-term memory: the LanceDB table, the service over it, its upkeep ---------------------------


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
    return MemoryService(
        store,
        embedder,
        memory_tuning(s),
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


def memory_tuning(s: LtmSettings) -> MemoryTuning:
    """Long-term memory's knobs: the settings' values for those that are settings, the measured constants
    (``ltm/tuning.py``) for the rest. Tests build theirs here too, from a ``Settings``."""
    return MemoryTuning(
        max_items_per_agent=s.ltm_max_items_per_agent,
        max_episodes_per_agent=s.ltm_max_episodes_per_agent,
        duplicate_similarity=s.ltm_duplicate_similarity,
        profile_max_items=s.ltm_profile_max_items,
        # The setting turns recall expansion on or off; its weight when on is a measured constant.
        expansion_weight=EXPANSION_WEIGHT if s.ltm_recall_expansion else 0.0,
    )
