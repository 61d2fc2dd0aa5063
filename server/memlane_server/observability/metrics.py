"""Prometheus metrics of a sidecar, each on the registry it is handed (one per server instance: tests run
several servers in one process), never on the process-global default.

- **The registry** (``new_registry``): process-level metrics (CPU, memory, file descriptors, garbage
  collection, Python version and ``memlane_build_info``). ``_created`` series are turned off
  process-wide: they double the series count of every counter and histogram, and Prometheus derives
  resets from the samples themselves.
- **RPCs** (``RpcMetrics``): the latency and outcome of each RPC, by method.
- **Model providers** (``ModelUsageMetrics``): work done by a model provider (summarization,
  extraction): calls by outcome, tokens read and written (what an LLM provider bills) and latency, each
  by provider.
- **Several processes, one scrape** (``merge``): one ``/metrics`` for a sidecar of several processes:
  the serving process's own metrics, then each worker process's, every worker sample labelled
  ``worker="<n>"``, families of the same name merged (a scrape target must not repeat a family). The
  workers serve their metrics on loopback ports of their own (``children.py``); the serving process
  reads them when it is scraped, so a sidecar is still one scrape target with every metric it had as one
  process: session end, promotion, extraction and embedding figures come from the workers.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Awaitable, Iterable, Iterator
from typing import TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from memlane import __version__

from ..build_info import commit

# The registry: process collectors and the build info.


def new_registry(*, settings_summary: dict[str, str] | None = None) -> CollectorRegistry:
    """A registry with the process collectors and the build info registered on it (never the global one:
    tests run several sidecars in one process)."""
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    info = Info("memlane_build", "The memlane release this process runs.", registry=registry)
    info.info(
        {
            "version": __version__,
            "commit": commit(),  # "" when unknown (a wheel built without the Dockerfile's VCS_REF)
            "python": platform.python_version(),
            **(settings_summary or {}),
        }
    )
    return registry


# RPCs.

# Buckets sized for a sidecar on loopback: most RPCs land between 0.3 ms and 20 ms.
_RPC_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class RpcMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.latency = Histogram(
            "memlane_rpc_duration_seconds",
            "Server-side latency of each RPC, from handler start to last response.",
            ["method"],
            registry=registry,
            buckets=_RPC_BUCKETS,
        )
        self.handled = Counter(
            "memlane_rpc_handled_total",
            "RPCs completed, by method and gRPC status code.",
            ["method", "code"],
            registry=registry,
        )
        self._latency_children: dict[str, Histogram] = {}
        self._handled_children: dict[tuple[str, str], Counter] = {}

    def observe(self, method: str, code: str, seconds: float) -> None:
        # labels() takes a lock and builds a tuple; cache the children on the hot path.
        hist = self._latency_children.get(method)
        if hist is None:
            hist = self._latency_children.setdefault(method, self.latency.labels(method))
        hist.observe(seconds)
        counter = self._handled_children.get((method, code))
        if counter is None:
            counter = self._handled_children.setdefault((method, code), self.handled.labels(method, code))
        counter.inc()


# Model providers.

T = TypeVar("T")

_MODEL_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ModelUsageMetrics:
    """Registered on the registry passed in (the app's), never on the process-global default."""

    def __init__(self, registry: CollectorRegistry, work: str) -> None:
        self.tokens_in = Counter(
            f"memlane_{work}_tokens_in",
            f"Tokens read by {work} (provider-billed for LLMs).",
            ["provider"],
            registry=registry,
        )
        self.tokens_out = Counter(
            f"memlane_{work}_tokens_out",
            f"Tokens written by {work} (provider-billed for LLMs).",
            ["provider"],
            registry=registry,
        )
        self.calls = Counter(
            f"memlane_{work}_calls",
            f"{work.capitalize()} calls by outcome.",
            ["provider", "outcome"],
            registry=registry,
        )
        self.latency = Histogram(
            f"memlane_{work}_latency_seconds",
            f"{work.capitalize()} latency.",
            ["provider"],
            registry=registry,
            buckets=_MODEL_BUCKETS,
        )

    async def timed(self, provider: str, call: Awaitable[T]) -> T:
        """Awaits ``call``, counting it as ok or error and observing its latency."""
        start = time.perf_counter()
        try:
            result = await call
        except BaseException:
            self.calls.labels(provider, "error").inc()
            raise
        finally:
            self.latency.labels(provider).observe(time.perf_counter() - start)
        self.calls.labels(provider, "ok").inc()
        return result

    def tokens(self, provider: str, tokens_in: int, tokens_out: int) -> None:
        self.tokens_in.labels(provider).inc(tokens_in)
        self.tokens_out.labels(provider).inc(tokens_out)


# Several processes, one scrape.


class _Families:
    """What ``generate_latest`` reads: anything with ``collect()``."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def merge(own: bytes, workers: Iterable[tuple[str, bytes]]) -> bytes:
    """``own`` (text exposition) with each worker's, its samples labelled ``worker``; a worker whose
    text does not parse is left out (its label shows in no sample, and the scrape still succeeds)."""
    merged: dict[str, Metric] = {}
    for family in text_string_to_metric_families(own.decode()):
        merged[family.name] = family
    for name, text in workers:
        try:
            families = list(text_string_to_metric_families(text.decode()))
        except ValueError:
            continue
        for family in families:
            target = merged.get(family.name)
            if target is None:
                target = merged[family.name] = Metric(family.name, family.documentation, family.type)
            target.samples += [
                Sample(s.name, {**s.labels, "worker": name}, s.value, s.timestamp, s.exemplar)
                for s in family.samples
            ]
    return bytes(generate_latest(_Families(merged.values())))
