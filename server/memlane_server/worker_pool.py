"""The worker processes of ``memlane serve``: started after the serving process serves, kept running,
stopped within the shutdown grace period.

Each child is ``memlane worker`` (``worker.py``) with this process's settings, handed over on its standard
input (no secret on a command line or on disk), and the Redis this process uses (an embedded one's
socket too). Children run at a lower CPU priority: on a small pod the serving process gets the cores
first, so a request's latency does not depend on how much background work is queued; idle cores still
go to the workers. A child that dies is started again (its jobs are taken over from the queue after the
claim timeout, as for any dead worker).

One model per pod: with long-term memory on, each child embeds through the model process
(``model_process.py``, ``--embedder-socket``) instead of loading its own copy. How children start and
end: ``children.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import orjson

from . import children
from .config import ENV_PREFIX, Settings, setting_fields

log = logging.getLogger("memlane")

# Niceness added to the workers': enough that the serving process wins a contended core nearly always.
WORKER_NICENESS = 10
# A child gets this much longer than the grace period to hand its jobs back before it is killed.
_STOP_MARGIN_S = 2.0
_METRICS_TIMEOUT_S = 2.0  # a scrape waits this long for a busy worker's metrics, then goes without


def worker_settings(settings: Settings, redis_url: str, admin_listen: str) -> bytes:
    """The child's settings file (JSON is YAML): every setting, with the Redis this process uses, no gRPC
    listener, and ``admin_listen`` for its metrics (read by this process: ``metrics``)."""
    values = {name: settings.value(name) for name in setting_fields()}
    values.update(
        redis_url=redis_url,
        listen="",
        admin_listen=admin_listen,
        worker_processes=0,
        pipeline_enabled=True,
    )
    return orjson.dumps(values)


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _get(port: int, path: str) -> bytes:
    """One HTTP GET on loopback (a worker's /metrics); the body, or b"" when it does not answer."""
    try:
        async with asyncio.timeout(_METRICS_TIMEOUT_S):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
            raw = await reader.read()
            writer.close()
    except (OSError, TimeoutError):
        return b""
    head, _, body = raw.partition(b"\r\n\r\n")
    return body if head.startswith(b"HTTP/1.1 200") else b""


class WorkerPool:
    def __init__(
        self,
        settings: Settings,
        *,
        redis_url: str,
        processes: int,
        embedder_socket: str = "",
    ) -> None:
        self._settings, self._redis_url = settings, redis_url
        self._embedder_socket = embedder_socket  # the model process's, or "" (no long-term memory)
        # Workers serve their metrics on loopback only when this process serves its own.
        self._with_metrics = bool(settings.server.admin_listen)
        self._metrics_ports: dict[int, int] = {}
        self._grace = settings.server.shutdown_grace_seconds
        self._children = {
            i: children.Supervised("a worker process", functools.partial(self._spawn, i), worker=i)
            for i in range(processes)
        }
        # The children read their settings from stdin only: a MEMLANE_* variable of this process must not
        # override what this process resolved from its flags (flags beat the environment).
        self._env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}

    @property
    def pids(self) -> list[int]:
        return [c.proc.pid for c in self._children.values() if c.alive and c.proc is not None]

    async def start(self) -> None:
        for child in self._children.values():
            await child.start()

    async def metrics(self) -> list[tuple[str, bytes]]:
        """Each live worker's metrics (text exposition), named by its index."""
        live = [(i, port) for i, port in self._metrics_ports.items() if self._children[i].alive]
        texts = await asyncio.gather(*(_get(port, "/metrics") for _, port in live))
        return [(str(i), text) for (i, _), text in zip(live, texts, strict=True) if text]

    async def _spawn(self, i: int) -> subprocess.Popen[bytes]:
        admin = ""
        if self._with_metrics:  # a fresh port each start: a dead child's may still be held a moment
            self._metrics_ports[i] = port = _free_loopback_port()
            admin = f"127.0.0.1:{port}"
        args = [sys.executable, "-m", "memlane_server.cli", "worker", "--config", "-"]
        args += ["--parent-pid", str(os.getpid())]
        if self._embedder_socket:
            args += ["--embedder-socket", self._embedder_socket]
        settings = worker_settings(self._settings, self._redis_url, admin)
        proc = await children.spawn(args, stdin=settings, env=self._env, niceness=WORKER_NICENESS)
        log.info("started a worker process", extra={"worker": i, "pid": proc.pid})
        return proc

    async def stop(self, deadline: float = 0.0) -> None:
        """SIGTERM to every child (each stops taking jobs and hands its jobs in flight back, releasing
        their leases), then SIGKILL for any still running at ``deadline`` (monotonic; 0: the grace
        period from now), and a few seconds after it at the latest."""
        for child in self._children.values():
            child.stop_restarting()
        live = [c.proc for c in self._children.values() if c.alive and c.proc is not None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        waits = [asyncio.ensure_future(children.exited(p)) for p in live]
        if waits:
            left = (deadline - time.monotonic()) if deadline else self._grace
            _, late = await asyncio.wait(waits, timeout=max(left, 0.0) + _STOP_MARGIN_S)
            for p in live:
                if p.poll() is None:
                    log.error("a worker process did not stop in time; killing it", extra={"pid": p.pid})
                    with contextlib.suppress(ProcessLookupError):
                        p.kill()
            if late:
                await asyncio.wait(late, timeout=5.0)
