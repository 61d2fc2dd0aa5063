"""The admin HTTP endpoint: ``/metrics`` (Prometheus text format), health, and any mounted apps (the
memory viewer under ``/viewer/``). Health: ``/readyz`` (and ``/healthz``, the same) answer 503 with the
reasons while the sidecar cannot serve (observability/health.py: gRPC health says the same); ``/livez``
answers 200 while the process answers at all (a restarting Redis makes a pod unready, not killed).

A few dozen lines of asyncio instead of a web framework: a handful of routes on a separate port, one
request per connection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .metrics import merge

log = logging.getLogger(__name__)

HealthCheck = Callable[[], Awaitable[list[str]]]  # why it cannot serve; empty: it can
MAX_BODY = 64 * 1024  # forms only: a few fields
# A request head (and a form body) must arrive within this: a slowloris trickling a byte a second is hung
# up on, not served for ever.
HEAD_TIMEOUT_S = 5.0
# Connections still sending their head, at most: past it the oldest is closed for the newcomer, so idle
# connections cannot hold file descriptors without bound, yet a probe (/healthz) always gets in.
MAX_READING = 256
# A reply the client does not read (a stalled /metrics download) is dropped after this.
WRITE_TIMEOUT_S = 10.0


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str  # percent-decoded, without the query
    raw_path: str  # as sent (segments still encoded): split this, then unquote each segment
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names
    form: dict[str, list[str]]
    peer_host: str


@dataclass(slots=True)
class HttpResponse:
    status: str = "200 OK"
    content_type: str = "text/html; charset=utf-8"
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


App = Callable[[HttpRequest], Awaitable[HttpResponse]]


def _peer_host(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""


async def _read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> HttpRequest:
    async with asyncio.timeout(
        HEAD_TIMEOUT_S
    ):  # not wait_for: on 3.11 it can swallow the server's shutdown cancel
        head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, *_ = lines[0].split(" ")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    raw_path, _, query = target.partition("?")
    form: dict[str, list[str]] = {}
    length = int(headers.get("content-length") or 0)
    if length > MAX_BODY:
        raise ValueError("request body too large")
    if length:
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            body = await reader.readexactly(length)
        if headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return HttpRequest(
        method=method,
        path=unquote(raw_path),
        raw_path=raw_path,
        query=parse_qs(query, keep_blank_values=True),
        headers=headers,
        form=form,
        peer_host=_peer_host(writer),
    )


# Other processes' metrics to serve with this one's: (name, text exposition) each (worker processes).
MetricsSource = Callable[[], Awaitable[list[tuple[str, bytes]]]]


class HttpEndpoint:
    def __init__(self, registry: CollectorRegistry, healthy: HealthCheck) -> None:
        self._registry = registry
        self._healthy = healthy
        self._apps: dict[str, App] = {}
        self._server: asyncio.Server | None = None
        self._more_metrics: MetricsSource | None = None
        self._reading: dict[asyncio.StreamWriter, None] = {}  # oldest first

    def serve_metrics_of(self, source: MetricsSource) -> None:
        """``/metrics`` also serves what ``source`` gives, each sample labelled with its process."""
        self._more_metrics = source

    def mount(self, prefix: str, app: App) -> None:
        """Routes every request whose path starts with ``prefix`` (e.g. ``/viewer/``) to ``app``."""
        self._apps[prefix] = app

    async def start(self, address: str) -> int:
        host, _, port = address.rpartition(":")
        self._server = await asyncio.start_server(self._handle, host.strip("[]") or "127.0.0.1", int(port))
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _route(self, request: HttpRequest) -> HttpResponse:
        for prefix, app in self._apps.items():
            if request.path.startswith(prefix) or request.path == prefix.rstrip("/"):
                return await app(request)
        if request.method != "GET":
            return HttpResponse("405 Method Not Allowed", "text/plain", b"GET only\n")
        if request.path == "/metrics":
            body = await asyncio.to_thread(generate_latest, self._registry)
            if self._more_metrics is not None:
                body = await asyncio.to_thread(merge, body, await self._more_metrics())
            return HttpResponse("200 OK", CONTENT_TYPE_LATEST, body)
        if request.path in ("/healthz", "/readyz"):
            reasons = await self._healthy()
            if not reasons:
                return HttpResponse("200 OK", "text/plain", b"ok\n")
            text = "unavailable\n" + "".join(f"{why}\n" for why in reasons)
            return HttpResponse("503 Service Unavailable", "text/plain", text.encode())
        if request.path == "/livez":
            return HttpResponse("200 OK", "text/plain", b"ok\n")
        return HttpResponse("404 Not Found", "text/plain", b"not found\n")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._reading) >= MAX_READING:
            oldest = next(iter(self._reading))
            del self._reading[oldest]
            oldest.close()  # its pending read ends (IncompleteReadError) and its handler returns
        self._reading[writer] = None
        try:
            try:
                request = await _read_request(reader, writer)
            finally:
                self._reading.pop(writer, None)
            response = await self._route(request)
            head = (
                f"HTTP/1.1 {response.status}\r\nContent-Type: {response.content_type}\r\n"
                f"Content-Length: {len(response.body)}\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in response.headers.items())
            )
            writer.write(head.encode("latin-1") + b"Connection: close\r\n\r\n" + response.body)
            async with asyncio.timeout(WRITE_TIMEOUT_S):
                await writer.drain()
        except (
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
            ValueError,
        ):
            pass
        except Exception:
            log.exception("admin http request failed")
        finally:
            writer.close()
