"""Domain metrics: what an operator asks about memlane itself, not about a process or an RPC.

Gauges of stored state (sessions by status, the session-end backlog, parked jobs, long-term memory items by
kind) are *sampled* by a background task every ``interval_s`` through probes the composition root hands in,
never counted per request: a scrape costs nothing, and a sidecar that restarts reports the truth at once.
Every label value comes from a closed set (statuses, kinds, sections, step and backend names).

This module imports nothing from the domain: probes are plain coroutines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from ..infra.periodic import Periodic

log = logging.getLogger(__name__)

T = TypeVar("T")
Probe = Callable[[], Awaitable[None]]

_BACKEND_BUCKETS = (0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)
_STEP_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_LAG_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


class DomainMetrics:
    """Every domain series, registered on the sidecar's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._stored_state(registry)
        self._backends(registry)
        self._pipeline_and_assembly(registry)
        self.sample_errors = Counter(
            "memlane_metric_sample_errors_total",
            "Failed samples of a domain gauge, by probe.",
            ["probe"],
            registry=registry,
        )
        self._redis_latency: dict[str, Histogram] = {}

    def _stored_state(self, registry: CollectorRegistry) -> None:
        """Sampled gauges of what Redis and LanceDB hold."""
        self.sessions = Gauge(
            "memlane_sessions", "Sessions in Redis by status (sampled).", ["status"], registry=registry
        )
        self.end_queue_depth = Gauge(
            "memlane_session_end_queue_depth",
            "Session-end jobs queued and not yet acknowledged (sampled).",
            registry=registry,
        )
        self.end_queue_pending = Gauge(
            "memlane_session_end_queue_pending",
            "Session-end jobs taken by a sidecar and not yet acknowledged (sampled).",
            registry=registry,
        )
        self.end_queue_pending_by_worker = Gauge(
            "memlane_session_end_queue_pending_by_worker",
            "Jobs (session end, learning) a worker has taken and not yet acknowledged, per worker holding"
            " any (sampled).",
            ["worker"],
            registry=registry,
        )
        self.end_queue_oldest_age = Gauge(
            "memlane_session_end_queue_oldest_age_seconds",
            "Age of the oldest queued session-end job; 0 when the queue is empty (sampled).",
            registry=registry,
        )
        self.parked_jobs = Gauge(
            "memlane_session_end_parked_jobs",
            "Session-end jobs parked after repeated failures, waiting for an operator (sampled).",
            registry=registry,
        )
        self.ltm_items = Gauge(
            "memlane_ltm_items", "Long-term memory items by kind (sampled).", ["kind"], registry=registry
        )

    def _backends(self, registry: CollectorRegistry) -> None:
        """Latency, errors and liveness of the storage backends."""
        self.backend_latency = Histogram(
            "memlane_backend_latency_seconds",
            "Latency of calls to a storage backend (redis, lancedb), by operation.",
            ["backend", "op"],
            registry=registry,
            buckets=_BACKEND_BUCKETS,
        )
        self.backend_errors = Counter(
            "memlane_backend_errors_total",
            "Failed calls to a storage backend, by operation.",
            ["backend", "op"],
            registry=registry,
        )
        self.backend_up = Gauge(
            "memlane_backend_up",
            "1 when the last probe of the backend succeeded.",
            ["backend"],
            registry=registry,
        )

    def _pipeline_and_assembly(self, registry: CollectorRegistry) -> None:
        """Session-end steps and what context assembly left out or found behind."""
        self.step_duration = Histogram(
            "memlane_pipeline_step_duration_seconds",
            "Duration of each session-end pipeline step (and of a whole job, step=job).",
            ["step"],
            registry=registry,
            buckets=_STEP_BUCKETS,
        )
        self.step_failures = Counter(
            "memlane_pipeline_step_failures_total",
            "Session-end pipeline steps that raised, by step.",
            ["step"],
            registry=registry,
        )
        self.truncations = Counter(
            "memlane_assembly_truncations_total",
            "Context assemblies that left something out of a section, by section.",
            ["section"],
            registry=registry,
        )
        self.summary_lag = Histogram(
            "memlane_summarization_lag_messages",
            "Messages between the rolling summary and the recent window at assembly (summarization lag).",
            registry=registry,
            buckets=_LAG_BUCKETS,
        )
        self.summary_behind = Counter(
            "memlane_summarization_behind_total",
            "Assemblies that found the rolling summary behind the history it should cover.",
            registry=registry,
        )

    def redis_command(self, family: str, seconds: float, failed: bool) -> None:
        """One Redis round trip by command family (infra/redis_pool.py). On the hot path: the
        histogram child of each family is looked up once, not per call."""
        child = self._redis_latency.get(family)
        if child is None:
            child = self._redis_latency[family] = self.backend_latency.labels("redis", family)
        child.observe(seconds)
        if failed:
            self.backend_errors.labels("redis", family).inc()

    async def backend_call(self, backend: str, op: str, call: Awaitable[T]) -> T:
        """Awaits ``call``, observing its latency and counting it as an error if it raises."""
        start = time.perf_counter()
        try:
            result = await call
        except Exception:
            self.backend_errors.labels(backend, op).inc()
            raise
        finally:
            self.backend_latency.labels(backend, op).observe(time.perf_counter() - start)
        return result

    async def step(self, name: str, call: Awaitable[T]) -> T:
        """Awaits one pipeline step, observing its duration and counting a failure if it raises."""
        start = time.perf_counter()
        try:
            return await call
        except Exception:
            self.step_failures.labels(name).inc()
            raise
        finally:
            self.step_duration.labels(name).observe(time.perf_counter() - start)

    def set_counts(self, gauge: Gauge, counts: Mapping[str, int], every: Iterable[str]) -> None:
        """Sets one child per label value, zero for values absent from ``counts`` (so a status that
        drains to nothing reads 0, not its last value)."""
        for value in {*every, *counts}:
            gauge.labels(value).set(counts.get(value, 0))


class CacheCollector(Collector):
    """Hit and miss counters of in-process caches, read at scrape time from ``(hits, misses)`` sources."""

    def __init__(
        self, registry: CollectorRegistry, sources: Mapping[str, Callable[[], tuple[int, int]]]
    ) -> None:
        self._sources = dict(sources)
        registry.register(self)

    def describe(self) -> list[Metric]:
        return []  # collected lazily: the sources may change size, never names

    def collect(self) -> Iterator[Metric]:
        hits = CounterMetricFamily(
            "memlane_cache_hits", "Cache lookups that hit, by cache.", labels=["cache"]
        )
        misses = CounterMetricFamily(
            "memlane_cache_misses", "Cache lookups that missed, by cache.", labels=["cache"]
        )
        for name, source in sorted(self._sources.items()):
            h, m = source()
            hits.add_metric([name], h)
            misses.add_metric([name], m)
        yield hits
        yield misses


class EmbeddingCollector(Collector):
    """Texts the embedding model ran, by lane (query, bulk), read at scrape time from ``source``: a
    worker's texts count in the serving process's bulk lane, where the one model runs them."""

    def __init__(self, registry: CollectorRegistry, source: Callable[[], Mapping[str, int]]) -> None:
        self._source = source
        registry.register(self)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        texts = CounterMetricFamily(
            "memlane_embedding_texts", "Texts the embedding model ran, by lane.", labels=["lane"]
        )
        for lane, count in sorted(self._source().items()):
            texts.add_metric([lane], count)
        yield texts


class Sampler:
    """Runs each probe every ``interval_s`` (the first time at once). A failing probe counts an error
    and leaves its gauges at their last value; it never stops the others."""

    def __init__(self, metrics: DomainMetrics, probes: Mapping[str, Probe], interval_s: float) -> None:
        self._metrics = metrics
        self._probes = dict(probes)
        self._interval = interval_s
        self._loop = Periodic("metrics-sampler", self.sample_once, interval_s, at_once=True)

    def start(self) -> None:
        if self._interval > 0 and self._probes:
            self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()

    async def sample_once(self) -> None:
        for name, probe in self._probes.items():
            try:
                await probe()
            except Exception as exc:
                self._metrics.sample_errors.labels(name).inc()
                log.warning("metric probe failed", extra={"probe": name, "error": repr(exc)})
