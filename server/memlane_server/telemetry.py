"""Wires the domain metrics to the domain: the probes the sampler runs, the cache collectors and the
meters (and spans) around LanceDB calls (the session-end job is metered beside it, in
``pipelines/metering.py``). Composition-level (like app.py): it reads the stores through their public
APIs and changes no domain behaviour.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Awaitable, Callable
from typing import TypeVar

import numpy as np
import numpy.typing as npt
from lancedb.expr import Expr
from opentelemetry.trace import SpanKind
from opentelemetry.util.types import AttributeValue
from prometheus_client import CollectorRegistry

from .config import ObservabilitySettings, Settings
from .context import ContextAssembler, MemorySource
from .context.model import AssembleStats, Section
from .context.sources import LtmMemorySource
from .embedding import Embedder, OnnxEmbedder
from .embedding.remote import RemoteEmbedder
from .ltm import MemoryService
from .ltm.model import MemoryItem
from .ltm.sharing import TableLock
from .ltm.store import Hit, LanceMemoryStore
from .memory_kinds import MemoryKind
from .observability import spans
from .observability.domain import CacheCollector, DomainMetrics, EmbeddingCollector, Probe, Sampler
from .observability.metrics import new_registry
from .sessions.ending import SessionEndQueue
from .sessions.model import SessionStatus
from .sessions.store import SessionStore

T = TypeVar("T")

# Counting sessions by status reads their documents: cap the sample so a huge keyspace costs a bounded
# amount per interval (the newest sessions are the ones whose status moves).
SESSION_SAMPLE_LIMIT = 20_000
_PAGE = 500
_STATUSES = [s.name.lower() for s in SessionStatus if s is not SessionStatus.UNSPECIFIED]
_KINDS = [k.value for k in MemoryKind]


def new_metrics(settings: Settings) -> tuple[CollectorRegistry, DomainMetrics]:
    """A sidecar's registry (process collectors and build info included) and its domain metrics."""
    registry = new_registry(
        settings_summary={
            "summarizer": settings.summarization.summarizer,
            "extractor": settings.extraction.extractor,
        }
    )
    return registry, DomainMetrics(registry)


def start_sampler(
    metrics: DomainMetrics,
    settings: ObservabilitySettings,
    *,
    sessions: SessionStore,
    queue: SessionEndQueue,
    ltm: MemoryService | None,
) -> Sampler:
    sampler = Sampler(
        metrics,
        probes(metrics, sessions=sessions, queue=queue, ltm=ltm),
        settings.metrics_sample_interval_seconds,
    )
    sampler.start()
    return sampler


def probes(
    metrics: DomainMetrics,
    *,
    sessions: SessionStore,
    queue: SessionEndQueue,
    ltm: MemoryService | None,
) -> dict[str, Probe]:
    async def redis_up() -> None:
        try:
            await metrics.backend_call("redis", "ping", sessions.ping())
        except Exception:
            metrics.backend_up.labels("redis").set(0)
            raise
        metrics.backend_up.labels("redis").set(1)

    async def session_status() -> None:
        counts: Tally[str] = Tally()
        for start in range(0, SESSION_SAMPLE_LIMIT, _PAGE):
            ids = await sessions.newest_session_ids(start, _PAGE)
            for s in await sessions.get_many(ids):
                if s is not None:
                    counts[s.status.name.lower()] += 1
            if len(ids) < _PAGE:
                break
        metrics.set_counts(metrics.sessions, counts, _STATUSES)

    async def end_queue() -> None:
        metrics.end_queue_depth.set(await queue.length())
        metrics.end_queue_pending.set(await queue.pending())
        by_worker = await queue.pending_by_worker()
        metrics.end_queue_pending_by_worker.clear()  # a worker that holds nothing (or is gone) drops out
        for worker, n in by_worker.items():
            metrics.end_queue_pending_by_worker.labels(worker).set(n)
        metrics.end_queue_oldest_age.set(await queue.oldest_age_ms(int(time.time() * 1000)) / 1000)

    async def parked_jobs() -> None:
        metrics.parked_jobs.set(await queue.parked_count())

    out: dict[str, Probe] = {
        "redis": redis_up,
        "sessions": session_status,
        "end_queue": end_queue,
        "parked": parked_jobs,
    }

    if ltm is not None:
        store = ltm.store

        async def ltm_items() -> None:
            table = await metrics.backend_call(
                "lancedb", "count_by_kind", store.fetch_columns(None, ["kind"])
            )
            counts = Tally(str(k) for k in table.column("kind").to_pylist())
            metrics.set_counts(metrics.ltm_items, counts, _KINDS)
            metrics.backend_up.labels("lancedb").set(1)

        out["ltm"] = ltm_items
    return out


def register_caches(
    registry: CollectorRegistry,
    context: ContextAssembler,
    memory: MemorySource | None,
    embedder: Embedder | None,
) -> None:
    """Every in-process cache in one collector (two would each emit the same metric families): turns'
    token counts, the profile cache of assembly, the in-memory recall index and the query-embedding
    cache of recall (the last three with long-term memory only)."""
    sources: dict[str, Callable[[], tuple[int, int]]] = {"token_counts": context.count_cache}
    if isinstance(memory, LtmMemorySource):
        ltm_source = memory
        sources["profile"] = lambda: (ltm_source.profile_hits, ltm_source.profile_misses)
        hot = ltm_source.service.hot_index.stats
        sources["recall_index"] = lambda: (hot.hits, hot.misses)
    cache = getattr(embedder, "cache", None)
    if cache is not None:
        sources["recall_embedding"] = lambda: (cache.hits, cache.misses)
    CacheCollector(registry, sources)


def register_embedding(registry: CollectorRegistry, embedder: Embedder) -> None:
    """Texts embedded by lane (``memlane_embedding_texts``): what this process's model ran, or what this
    process asked the model process for."""
    if isinstance(embedder, OnnxEmbedder | RemoteEmbedder):
        EmbeddingCollector(registry, embedder.texts_by_lane)


def record_assembly(metrics: DomainMetrics, stats: AssembleStats) -> None:
    """Truncations by section and the summarization lag of one finished assembly."""
    for t in stats.truncations:
        metrics.truncations.labels(Section(t.section).name.lower()).inc()
    metrics.summary_lag.observe(stats.gap_message_count)
    if stats.summary_behind:
        metrics.summary_behind.inc()


def _lance_attributes(op: str) -> dict[str, AttributeValue]:
    return {**spans.db_attributes("lancedb", op), "db.collection.name": "memories"}


class MeteredLanceStore(LanceMemoryStore):
    """The LanceDB store with the latency and failures of each call (``backend="lancedb"``) and, inside a
    traced call, a CLIENT span for each (``{operation} memories``). Built by
    ``LanceMemoryStore.open`` (which constructs ``cls``); ``metrics`` is set right after."""

    metrics: DomainMetrics | None = None

    @classmethod
    async def open_metered(
        cls,
        metrics: DomainMetrics,
        uri: str,
        ndims: int,
        *,
        cache_mb: int = 0,
        lock: TableLock | None = None,
        read_consistency_s: float = -1.0,
    ) -> MeteredLanceStore:
        store = await cls.open(
            uri, ndims, cache_mb=cache_mb, lock=lock, read_consistency_s=read_consistency_s
        )
        if not isinstance(store, MeteredLanceStore):  # open() builds ``cls``; a change there shows here
            raise TypeError("LanceMemoryStore.open no longer builds its subclass")
        store.metrics = metrics
        return store

    async def _timed(self, op: str, call: Awaitable[T]) -> T:
        timed = self.metrics.backend_call("lancedb", op, call) if self.metrics is not None else call
        if not spans.active():
            return await timed
        with spans.leaf(f"{op} memories", kind=SpanKind.CLIENT, attributes=_lance_attributes(op)):
            return await timed

    async def count(self, where: Expr | None = None) -> int:
        return await self._timed("count", super().count(where))

    async def add(self, items: list[MemoryItem]) -> None:
        await self._timed("add", super().add(items))

    async def upsert(self, items: list[MemoryItem]) -> None:
        await self._timed("upsert", super().upsert(items))

    async def update(self, where: Expr, values_sql: dict[str, str]) -> None:
        await self._timed("update", super().update(where, values_sql))

    async def delete(self, where: Expr) -> None:
        await self._timed("delete", super().delete(where))

    async def fetch(
        self, where: Expr, *, with_vector: bool = False, limit: int | None = None
    ) -> list[MemoryItem]:
        return await self._timed("fetch", super().fetch(where, with_vector=with_vector, limit=limit))

    async def newest_keys(self, where: Expr, limit: int) -> list[tuple[int, str]]:
        return await self._timed("newest_keys", super().newest_keys(where, limit))

    async def keyword_search(self, text: str, where: Expr, limit: int) -> list[Hit]:
        return await self._timed("keyword_search", super().keyword_search(text, where, limit))

    async def vector_search(self, vector: npt.NDArray[np.float32], where: Expr, limit: int) -> list[Hit]:
        return await self._timed("vector_search", super().vector_search(vector, where, limit))
