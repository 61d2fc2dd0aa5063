"""Prometheus metrics. One registry per server instance (tests run several servers in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

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
