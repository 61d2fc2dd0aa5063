"""What ``memlane serve`` and ``memlane worker`` run once their start checks passed (``preflight.py``) and
unused packages were deferred: logging, uvloop, tracing when the OTEL_* variables ask for it, then the
serving process (``app.Sidecar``) or a worker (``Worker``), until a signal; imported only then, because
it loads the whole server.

``Worker`` is the composition root of a worker process (``memlane worker``): the background half of a
sidecar alone. It builds the same parts as the serving process (``app.Sidecar``: Redis, stores,
long-term memory, the providers, the session-end parts) and starts only the background jobs: the job
stream's consumer (session end and learning during the session), retirement, archive retention and the
LTM table's upkeep. No gRPC port; ``/metrics`` and ``/healthz`` on ``admin_listen`` when set.

``memlane serve`` starts ``worker_processes`` of these beside its serving process (``children.py``),
each embedding through its model process (``--embedder-socket``: one model per pod); a cluster
runs them as a Deployment beside thin sidecars (``pipeline_enabled: false``), all against the same Redis,
LanceDB table and archive, each with a model of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from .. import children
from ..app import Sidecar, run_until_signalled
from ..config import ConfigError, Settings
from ..embedding.remote import START_WAIT_S, RemoteEmbedder
from ..heartbeat import Heartbeat
from ..infra.periodic import Periodic
from ..observability.logs import configure
from ..observability.tracing import configure_tracing, tracing_requested
from ..preflight import START_ERRORS

log = logging.getLogger("memlane")


class Worker(Sidecar):
    _serves_requests = False
    _shares_model = False  # it asks the model process of its memlane serve, or loads its own

    def __init__(
        self, settings: Settings, *, embedder_socket: str = "", heartbeat: Heartbeat | None = None
    ) -> None:
        super().__init__(settings)
        # The model process of the memlane serve that started this worker; "": a model of its own (a
        # worker Deployment's pod has nothing to share it with).
        self._embedder_socket = embedder_socket
        # Signs of life for the memlane serve that started it (none in a worker Deployment: heartbeat.py).
        self._heartbeat = heartbeat or Heartbeat(-1, settings.server.child_stall_seconds)

    async def start(self) -> None:
        self._heartbeat.start()  # the event loop beats from here: a wedged loop is a stalled worker
        self._closes["heartbeat"] = self._heartbeat.stop
        if not self.settings.redis.redis_url:
            raise ConfigError("memlane worker needs redis_url: the Redis of the sidecars whose jobs it runs")
        await self._preflight(listens=False)
        if self._embedder_socket and self.settings.ltm.ltm_enabled:
            # Bulk work has no caller waiting on it: it bears a silent model process as long as the model
            # process's supervisor does (then that one is replaced), and waits for a restarted one.
            self._embedder = remote = await RemoteEmbedder.connect(
                self._embedder_socket,
                bulk=True,
                silence_s=self.settings.server.child_stall_seconds,
                reconnect_s=START_WAIT_S,
            )
            self._closes["embedder"] = remote.close
        await self._foundation()
        await self._start_admin(with_viewer=False)
        await self._start_background()
        trim = Periodic("return-freed-memory", children.return_freed_memory, children.TRIM_INTERVAL_S)
        self._closes["memory trim"] = trim.stop
        trim.start()
        self._heartbeat.serving()
        log.info(
            "memlane worker running",
            extra={"consumer": self.end.worker.consumer, "admin_port": self.admin_port},
        )


def run_process(args: argparse.Namespace, settings: Settings, heartbeat: Heartbeat | None = None) -> int:
    """Run ``memlane serve`` or ``memlane worker`` until signalled; the command's exit status (``heartbeat``:
    a worker's, beating since its start)."""
    configure(settings.observability.log_level, settings.observability.log_format)
    children.limit_malloc_arenas()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    tracer_provider = None
    if tracing_requested(os.environ):  # OTEL_*: off unless they ask (observability/tracing.py)
        try:
            tracer_provider = configure_tracing(os.environ)
        except ConfigError as exc:
            print(f"memlane: {exc}", file=sys.stderr)
            return 2
    runtime = (
        Sidecar(settings)
        if args.command == "serve"
        else Worker(
            settings,
            embedder_socket=getattr(args, "embedder_socket", ""),
            heartbeat=heartbeat,
        )
    )
    try:
        asyncio.run(run_until_signalled(runtime, parent_pid=getattr(args, "parent_pid", 0)))
    except (ConfigError, *START_ERRORS) as exc:  # what was started is stopped by then
        print(f"memlane: {exc}", file=sys.stderr)
        return 2
    finally:
        if tracer_provider is not None:
            tracer_provider.shutdown()  # the last batch of spans goes out before the exit
    if args.command == "worker":
        # A CPU-bound step still running in a pool thread (its job already handed back) must not hold
        # the exit past the grace period: the interpreter would join that thread.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0
