"""The admin HTTP endpoint: ``/metrics`` (Prometheus text format) and ``/healthz``.

A few dozen lines of asyncio instead of a web framework: two read-only routes on a separate port.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

HealthCheck = Callable[[], Awaitable[bool]]


class AdminHttpServer:
    def __init__(self, registry: CollectorRegistry, healthy: HealthCheck) -> None:
        self._registry = registry
        self._healthy = healthy
        self._server: asyncio.Server | None = None

    async def start(self, address: str) -> int:
        host, _, port = address.rpartition(":")
        self._server = await asyncio.start_server(self._handle, host.strip("[]") or "127.0.0.1", int(port))
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            method, path, *_ = request.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            path = path.split("?", 1)[0]
            if method != "GET":
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path == "/metrics":
                body = await asyncio.to_thread(generate_latest, self._registry)
                status, ctype = "200 OK", CONTENT_TYPE_LATEST
            elif path in ("/healthz", "/readyz"):
                ok = await self._healthy()
                status = "200 OK" if ok else "503 Service Unavailable"
                ctype, body = "text/plain", b"ok\n" if ok else b"unavailable\n"
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            head = f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            writer.write(head.encode() + b"Connection: close\r\n\r\n" + body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        except Exception:
            log.exception("admin http request failed")
        finally:
            writer.close()
