"""The composition root: settings in, a running sidecar out. The only module that imports everything."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from memlane.v1 import session_service_pb2, session_service_pb2_grpc
from prometheus_client import CollectorRegistry

from .api.interceptor import BoundaryInterceptor
from .api.sessions import SessionServicer
from .config import Settings
from .infra.embedded_redis import EmbeddedRedis
from .infra.redis_pool import UNAVAILABLE_ERRORS, connect
from .observability.admin_http import AdminHttpServer
from .observability.metrics import RpcMetrics
from .sessions.keys import KeySpace
from .sessions.limits import Limits
from .sessions.store import SessionStore
from .tokens import TokenCounter

log = logging.getLogger("memlane")


class Sidecar:
    """Owns every resource of one running server. ``start()`` then ``stop()``; ``addresses`` lists the
    bound gRPC endpoints (ports resolved when a listen address asks for port 0)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        self.addresses: list[str] = []
        self.admin_port: int | None = None
        self._embedded: EmbeddedRedis | None = None
        self._server: grpc.aio.Server | None = None
        self._admin: AdminHttpServer | None = None
        self._health = health.aio.HealthServicer()
        self._executor = ThreadPoolExecutor(settings.executor_threads, thread_name_prefix="memlane-cpu")

    async def start(self) -> None:
        s = self.settings
        redis_url = s.redis_url
        if not redis_url:
            self._embedded = EmbeddedRedis(Path(s.data_dir) / "redis")
            await self._embedded.astart()
            redis_url = self._embedded.url
            log.info("started embedded redis", extra={"url": redis_url})
        self.redis = connect(redis_url)
        await self.redis.ping()

        tokens = await asyncio.to_thread(TokenCounter, s.default_encoding)
        self.keys = KeySpace(s.key_prefix)
        self.sessions = SessionStore(
            self.redis,
            self.keys,
            tokens,
            limits=Limits(
                max_message_bytes=s.max_message_bytes,
                max_batch_messages=s.max_batch_messages,
                max_batch_bytes=s.max_batch_bytes,
            ),
            default_ttl_seconds=s.session_ttl_seconds,
            executor=self._executor,
        )

        metrics = RpcMetrics(self.registry)
        server = grpc.aio.server(
            interceptors=[BoundaryInterceptor(metrics, UNAVAILABLE_ERRORS)],
            options=[
                ("grpc.max_receive_message_length", s.max_receive_message_bytes),
                ("grpc.so_reuseport", 0),  # a second sidecar on the same port must fail, not share it
                ("grpc.keepalive_permit_without_calls", 1),
            ],
        )
        session_service_pb2_grpc.add_SessionServiceServicer_to_server(SessionServicer(self.sessions), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        services = [
            session_service_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ]
        reflection.enable_server_reflection(services, server)
        for address in filter(None, (a.strip() for a in s.listen.split(","))):
            self.addresses.append(self._bind(server, address))
        await server.start()
        self._server = server
        for name in [*services[:1], ""]:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if s.admin_listen:
            self._admin = AdminHttpServer(self.registry, self._healthy)
            self.admin_port = await self._admin.start(s.admin_listen)
        log.info("memlane serving", extra={"grpc": self.addresses, "admin_port": self.admin_port})

    @staticmethod
    def _bind(server: grpc.aio.Server, address: str) -> str:
        if address.startswith("unix:"):
            path = Path(address[len("unix:") :].removeprefix("//"))
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a stale socket from a crashed run
            server.add_insecure_port(f"unix:{path}")
            return f"unix:{path}"
        port = server.add_insecure_port(address)
        if port == 0:
            raise OSError(f"cannot listen on {address}")
        host = address.rsplit(":", 1)[0]
        return f"{host}:{port}"

    async def _healthy(self) -> bool:
        try:
            return bool(await self.redis.ping())
        except Exception:
            return False

    async def stop(self) -> None:
        """Health NOT_SERVING first (load balancers stop sending), then drain in-flight calls, then
        close pools and the embedded Redis."""
        await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(self.settings.shutdown_grace_seconds)
        if self._admin is not None:
            await self._admin.stop()
        if hasattr(self, "redis"):
            await self.redis.aclose()
        if self._embedded is not None:
            await self._embedded.astop()
        self._executor.shutdown(wait=False, cancel_futures=True)


async def serve(settings: Settings) -> None:
    """Runs until SIGINT or SIGTERM, then shuts down gracefully."""
    sidecar = Sidecar(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await sidecar.start()
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await sidecar.stop()
