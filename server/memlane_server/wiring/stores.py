"""The Redis-backed stores (``sessions/``): sessions, checkpoints, procedures, versions, traces."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ..checkpoints.store import CheckpointStore
from ..config import Settings
from ..extraction import find_pii
from ..infra.redis_pool import RedisClient
from ..keyspace import KeySpace
from ..ltm.history import MemoryHistory
from ..ltm.redis_state import RedisMemoryHistory
from ..procedures import Owner, ProcedureService
from ..procedures.store import ProcedureStore
from ..sessions.ending import EndState
from ..sessions.limits import Limits
from ..sessions.model import Topology
from ..sessions.scripts import Durability
from ..sessions.store import SessionStore
from ..sessions.traces import TraceRecords
from ..tokens import TokenCounter


@dataclass(frozen=True, slots=True)
class Stores:
    keys: KeySpace
    sessions: SessionStore
    checkpoints: CheckpointStore
    procedures: ProcedureService
    memory_history: MemoryHistory  # over RedisMemoryHistory
    traces: TraceRecords
    end_state: EndState


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
    sessions = SessionStore(
        redis,
        keys,
        tokens,
        limits=Limits(
            max_message_bytes=s.max_message_bytes,
            max_batch_messages=s.max_batch_messages,
            max_batch_bytes=s.max_batch_bytes,
        ),
        default_ttl_seconds=s.session_ttl_seconds,
        default_topology=Topology[s.default_topology.upper()],
        executor=executor,
        durability=Durability(r.redis_wait_replicas, r.redis_wait_timeout_ms),
    )
    return Stores(
        keys=keys,
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
