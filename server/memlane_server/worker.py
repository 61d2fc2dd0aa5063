"""The composition root of a worker process (``memlane worker``): the background half of a sidecar alone.

It builds the same parts as the serving process (``app.Sidecar``: Redis, stores, long-term memory, the
providers, the session-end parts) and starts only the background jobs: the job stream's consumer
(session end and learning during the session), retirement, archive retention and the LTM table's
upkeep. No gRPC port; ``/metrics`` and ``/healthz`` on ``admin_listen`` when set.

``memlane serve`` starts ``worker_processes`` of these beside its serving process (``worker_pool.py``),
each embedding through its model process (``--embedder-socket``: one model per pod); a cluster
runs them as a Deployment beside thin sidecars (``pipeline_enabled: false``), all against the same Redis,
LanceDB table and archive, each with a model of its own.
"""

from __future__ import annotations

import logging

from . import children
from .app import Sidecar
from .config import ConfigError, Settings
from .embedding.remote import RemoteEmbedder
from .infra.periodic import Periodic

log = logging.getLogger("memlane")


class Worker(Sidecar):
    _serves_requests = False
    _shares_model = False  # it asks the model process of its memlane serve, or loads its own

    def __init__(self, settings: Settings, *, embedder_socket: str = "") -> None:
        super().__init__(settings)
        # The model process of the memlane serve that started this worker; "": a model of its own (a
        # worker Deployment's pod has nothing to share it with).
        self._embedder_socket = embedder_socket

    async def start(self) -> None:
        if not self.settings.redis.redis_url:
            raise ConfigError("memlane worker needs redis_url: the Redis of the sidecars whose jobs it runs")
        await self._preflight(listens=False)
        if self._embedder_socket and self.settings.ltm.ltm_enabled:
            self._embedder = remote = await RemoteEmbedder.connect(self._embedder_socket, bulk=True)
            self._closes["embedder"] = remote.close
        await self._foundation()
        await self._start_admin(with_viewer=False)
        await self._start_background()
        trim = Periodic("return-freed-memory", children.return_freed_memory, children.TRIM_INTERVAL_S)
        self._closes["memory trim"] = trim.stop
        trim.start()
        log.info(
            "memlane worker running",
            extra={"consumer": self.end.worker.consumer, "admin_port": self.admin_port},
        )
