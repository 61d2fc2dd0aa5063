"""Health that tells the truth: one verdict for gRPC health, ``/healthz``/``/readyz`` and ``memlane
health``, from checks that look at what serving needs, not at whether the process is up.

- Readiness (gRPC health of the server, ``""``, and of the services named at start; ``/readyz`` and
  ``/healthz``): NOT_SERVING while any check fails: Redis does not answer a PING through a *new*
  connection (a pooled one can outlive a deleted socket file or a dead listener), Redis refuses writes
  (MISCONF: its disk is full), the embedded Redis is being started again, LTM's table is damaged, the
  model process or a worker process gives no sign of life, exited or is starting again (``children.py``,
  ``supervision.py``: a stalled one is killed after ``child_stall_seconds``). Other parts add their own
  with ``add_check`` (a check returns the reason it cannot serve, or None).
- Liveness (gRPC health of ``LIVENESS_SERVICE``; ``/livez``): SERVING while the event loop answers. A
  restarting Redis makes the pod unready, not killed; only a wedged process fails it (the probe times out).

The verdict is computed at most once per ``FRESH_S`` (probes and hostile callers alike cost one Redis
connection per second at most), and again every ``REFRESH_S`` in the background so ``Watch`` streams and
the ``memlane_health_serving`` gauge follow it; each change is logged once with its reasons.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

import grpc
from grpc_health.v1 import health, health_pb2
from prometheus_client import CollectorRegistry, Counter, Gauge

from ..infra.periodic import Periodic

log = logging.getLogger("memlane")

# The service name a liveness probe asks for (Kubernetes: ``grpc: {port, service: memlane.liveness}``).
LIVENESS_SERVICE = "memlane.liveness"
FRESH_S = 1.0
REFRESH_S = 5.0
REASONS_KEY = "memlane-health-reasons"  # trailing metadata of a NOT_SERVING Check: why, part by part
_REASONS_MAX = 2000

Check = Callable[[], Awaitable[str | None]]  # None: fine; else why the sidecar cannot serve

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class PodMetrics:
    """The pod's own faults, counted: embedded Redis restarts, gRPC connections shed, the verdict. With no
    ``registry`` (a worker process: no gRPC, no verdict of the pod's) they are kept but not exported."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.redis_restarts = Counter(
            "memlane_embedded_redis_restarts_total",
            "Times the embedded Redis died while the sidecar lived and was started again on its AOF.",
            registry=registry,
        )
        self.serving = Gauge(
            "memlane_health_serving",
            "1 while health says SERVING (readiness), 0 while a check fails.",
            registry=registry,
        )
        self.grpc_connections = Gauge(
            "memlane_grpc_connections",
            "Open gRPC connections (sampled), against memlane_grpc_connections_max.",
            registry=registry,
        )
        self.grpc_connections_max = Gauge(
            "memlane_grpc_connections_max",
            "The cap on open gRPC connections, sized from the descriptor limit (RLIMIT_NOFILE).",
            registry=registry,
        )
        self.grpc_connections_shed = Counter(
            "memlane_grpc_connection_cap_reached_total",
            "Samples that found gRPC connections at the cap (connections that sent no request shed).",
            registry=registry,
        )
        self.grpc_connections_closed_unused = Counter(
            "memlane_grpc_connections_shed_total",
            "Connections closed because they sent no request: at the cap, or past the first-request"
            " allowance.",
            registry=registry,
        )


class PodHealth(health.aio.HealthServicer):
    """gRPC health whose ``Check`` asks the checks first (cached for ``FRESH_S``)."""

    def __init__(self, metrics: PodMetrics) -> None:
        super().__init__()
        self._metrics = metrics
        self._checks: dict[str, Check] = {}
        self._names: list[str] = []  # services whose status is the verdict ("" included)
        self._reasons: list[str] = []
        self._at = -FRESH_S
        self._lock = asyncio.Lock()
        self._stopping = False
        self._refresher = Periodic("health", self.reasons, REFRESH_S)

    def add_check(self, name: str, check: Check) -> None:
        self._checks[name] = check

    async def serve(self, names: Iterable[str]) -> None:
        """SERVING for ``names`` (and liveness) now; from then on the verdict decides for ``names``. (A
        worker process serves no gRPC: its verdict is asked through ``/readyz`` alone.)"""
        self._names = [*names]
        self._metrics.serving.set(1)
        await self.set(LIVENESS_SERVICE, SERVING)
        for name in self._names:
            await self.set(name, SERVING)
        self._refresher.start()

    async def reasons(self) -> list[str]:
        """Why the sidecar cannot serve now (empty: it can)."""
        if time.monotonic() - self._at < FRESH_S:
            return self._reasons
        async with self._lock:
            if time.monotonic() - self._at >= FRESH_S:
                await self._evaluate()
        return self._reasons

    async def _evaluate(self) -> None:
        names = list(self._checks)
        found = await asyncio.gather(*(self._checks[n]() for n in names), return_exceptions=True)
        reasons = []
        for name, outcome in zip(names, found, strict=True):
            why = f"the check failed: {outcome!r}" if isinstance(outcome, BaseException) else outcome
            if why:
                reasons.append(f"{name}: {why}")
        was, self._reasons, self._at = self._reasons, reasons, time.monotonic()
        if reasons != was:
            if reasons:
                log.error("health: NOT_SERVING (%s)", "; ".join(reasons))
            elif was:
                log.warning("health: SERVING again")
        if not self._stopping:
            self._metrics.serving.set(0 if reasons else 1)
            for name in self._names:  # a no-op once the drain has set NOT_SERVING for good
                await self.set(name, NOT_SERVING if reasons else SERVING)

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        if request.service in self._names and (reasons := await self.reasons()):
            # gRPC health has a status only: the reasons (which part, why) ride along for `memlane health`.
            text = " | ".join(reasons).encode("ascii", "replace").decode()[:_REASONS_MAX]
            context.set_trailing_metadata(((REASONS_KEY, text),))
        return await super().Check(request, context)

    async def enter_graceful_shutdown(self) -> None:
        self._stopping = True
        await self._refresher.stop()
        self._metrics.serving.set(0)
        await super().enter_graceful_shutdown()
