"""Child processes of ``memlane serve``: its worker processes and its model process, in sections of
their own below. How a child is started, watched for progress (a heartbeat pipe: a child that stops
without dying is killed and started again) and restarted: ``supervision.py``.

**Worker processes** (``WorkerPool``): started after the serving process serves, kept running, stopped
within the shutdown grace period.

Each child is ``memlane worker`` (``cli/start.py``) with this process's settings, handed over on its
standard input (no secret on a command line or on disk), and the Redis this process uses (an embedded one's
socket too). Children run at a lower CPU priority: on a small pod the serving process gets the cores
first, so a request's latency does not depend on how much background work is queued; idle cores still
go to the workers. A child that dies, or gives no sign of life for ``child_stall_seconds`` (stopped,
wedged: it is killed), is started again (its jobs are taken over from the queue after the claim timeout,
as for any dead worker); meanwhile the pod's health names it.

One model per pod: with long-term memory on, each child embeds through the model process
(below, ``--embedder-socket``) instead of loading its own copy.

**The model process** (``ModelProcess``; ``main`` is the child's own entry point, ``python -m
memlane_server.children SOCKET PARENT_PID``): the pod's one copy of the embedding model.

With worker processes, the serving process starts this child before anything asks for a vector and
embeds through it, as the workers do (``embedding/remote.py``): one model per pod, whatever the number of
processes. Being a process of its own, its bulk batches never hold the serving process's interpreter lock
and its threads set their own priorities (a query thread at the pod's, bulk threads lower: see
``embedding/onnx.py``). It imports the model's libraries and nothing else of the sidecar.

It listens on a Unix socket in a directory only this user can enter, made for this run and removed at its
end. A model process that dies, or gives no sign of life for ``child_stall_seconds``, is started again
on the same socket; the asking processes reconnect. A call meanwhile fails within
``embedding_call_timeout_seconds`` of silence (``RemoteEmbedder``), as a call to a gone Redis fails:
UNAVAILABLE with a retry hint, never the caller's whole deadline.
It stops when ``memlane serve`` stops it, or by itself within a second when its parent is gone, even
after a SIGKILL.

Without worker processes (``worker_processes`` 0, thin sidecars, the test suite) the serving process
loads the model itself: there is nothing to share it with.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from .config import ENV_PREFIX, Settings, build_settings, setting_fields
from .embedding.remote import EmbeddingServer
from .heartbeat import Heartbeat
from .infra.periodic import Periodic
from .observability.logs import configure
from .supervision import PartMetrics, Supervised, exited, spawn
from .wiring.embedding import load_embedder

log = logging.getLogger("memlane")


async def parent_gone(parent_pid: int, stop: asyncio.Event) -> None:
    """Sets ``stop`` once the process ``parent_pid`` is gone: a child outlives no serving process, even
    one killed with SIGKILL. Polled, as nothing signals it portably: a process is re-parented once its
    parent dies."""
    while True:
        await asyncio.sleep(_PARENT_CHECK_S)
        if os.getppid() != parent_pid:
            break
    log.warning("the serving process is gone; stopping")
    stop.set()


_PARENT_CHECK_S = 1.0


# glibc's M_ARENA_MAX: gRPC, ONNX Runtime and LanceDB run many threads, and glibc gives each thread
# its own malloc arena by default; their idle memory made the sidecar with LTM ~170 MB bigger.
_M_ARENA_MAX = -8


def limit_malloc_arenas(arenas: int = 2) -> None:
    """Like MALLOC_ARENA_MAX=2, for each process of memlane serve (serving, workers, the model process)
    before its threads start; an explicit variable wins."""
    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
        ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, arenas)


# How often a background process of memlane serve (a worker, the model process) hands memory it freed
# back to the system. glibc keeps freed heap for reuse: after a burst (a hostile 120 KB turn promoted, a
# flood of Embed calls) a process stayed 50-60 MB bigger for good. Not in the serving process: the trim
# holds the allocator's lock for a moment, which a request would wait for.
TRIM_INTERVAL_S = 30.0


async def return_freed_memory() -> None:
    """One ``malloc_trim(0)``, off the event loop (it walks the heap)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
            await asyncio.to_thread(ctypes.CDLL("libc.so.6").malloc_trim, 0)


# Worker processes: ``memlane worker`` children, kept running beside the serving process.


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
        metrics: PartMetrics,
        embedder_socket: str = "",
    ) -> None:
        self._settings, self._redis_url = settings, redis_url
        self._embedder_socket = embedder_socket  # the model process's, or "" (no long-term memory)
        # Workers serve their metrics on loopback only when this process serves its own.
        self._with_metrics = bool(settings.server.admin_listen)
        self._metrics_ports: dict[int, int] = {}
        self._grace = settings.server.shutdown_grace_seconds
        stall_s = settings.server.child_stall_seconds
        self._children = {
            i: Supervised(
                "a worker process",
                f"worker-{i}",
                functools.partial(self._spawn, i),
                name=f"worker process {i}",
                stall_s=stall_s,
                metrics=metrics,
                worker=i,
            )
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

    async def health(self) -> str | None:
        """Which worker does not serve now and why (a health check: its jobs wait meanwhile)."""
        reasons = [why for child in self._children.values() if (why := child.reason())]
        return "; ".join(reasons) or None

    async def metrics(self) -> list[tuple[str, bytes]]:
        """Each live worker's metrics (text exposition), named by its index."""
        live = [(i, port) for i, port in self._metrics_ports.items() if self._children[i].alive]
        texts = await asyncio.gather(*(_get(port, "/metrics") for _, port in live))
        return [(str(i), text) for (i, _), text in zip(live, texts, strict=True) if text]

    async def _spawn(self, i: int, heartbeat_fd: int) -> subprocess.Popen[bytes]:
        admin = ""
        if self._with_metrics:  # a fresh port each start: a dead child's may still be held a moment
            self._metrics_ports[i] = port = _free_loopback_port()
            admin = f"127.0.0.1:{port}"
        args = [sys.executable, "-m", "memlane_server.cli", "worker", "--config", "-"]
        args += ["--parent-pid", str(os.getpid()), "--heartbeat-fd", str(heartbeat_fd)]
        if self._embedder_socket:
            args += ["--embedder-socket", self._embedder_socket]
        settings = worker_settings(self._settings, self._redis_url, admin)
        proc = await spawn(
            args, stdin=settings, env=self._env, niceness=WORKER_NICENESS, pass_fds=(heartbeat_fd,)
        )
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
        waits = [asyncio.ensure_future(exited(p)) for p in live]
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


# The model process: the pod's one copy of the embedding model, and the child's own entry point.


_STOP_S = 5.0  # a model process has nothing to hand back: it gets this long, then SIGKILL


class ModelProcess:
    """Started with ``start`` (``RemoteEmbedder.connect`` waits for it to answer), restarted when it dies
    or stalls, ``stop``ped last."""

    def __init__(self, settings: Settings, metrics: PartMetrics) -> None:
        self._settings = settings
        self._dir = Path(tempfile.mkdtemp(prefix="memlane-model-"))  # mode 0700: this user alone
        self.socket = str(self._dir / "model.sock")
        self._env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
        self._child = Supervised(
            "the model process",
            "model",
            self._spawn,
            stall_s=settings.server.child_stall_seconds,
            metrics=metrics,
        )

    @property
    def pid(self) -> int | None:
        return self._child.proc.pid if self._child.alive and self._child.proc is not None else None

    async def start(self) -> None:
        await self._child.start()

    async def health(self) -> str | None:
        """Why the model process does not serve now (a health check: recall and embedding fail meanwhile)."""
        return self._child.reason()

    async def _spawn(self, heartbeat_fd: int) -> subprocess.Popen[bytes]:
        values = {name: self._settings.value(name) for name in setting_fields()}
        args = [sys.executable, "-m", "memlane_server.children", self.socket, str(os.getpid())]
        args.append(str(heartbeat_fd))
        proc = await spawn(args, stdin=orjson.dumps(values), env=self._env, pass_fds=(heartbeat_fd,))
        log.info("started the model process", extra={"pid": proc.pid})
        return proc

    async def stop(self) -> None:
        self._child.stop_restarting()
        proc = self._child.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(exited(proc), _STOP_S)
            except TimeoutError:
                proc.kill()
                await exited(proc)
        shutil.rmtree(self._dir, ignore_errors=True)


async def _serve(settings: Settings, path: str, parent_pid: int, heartbeat: Heartbeat) -> None:
    heartbeat.start()  # from the first instruction: loading the model is progress too
    embedder = await load_embedder(settings.embedding)
    server = EmbeddingServer(embedder, alive_s=settings.embedding.embedding_call_timeout_seconds / 4)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a dead predecessor's: this one binds the same path
    await server.listen(path)
    heartbeat.serving()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    watch = asyncio.create_task(parent_gone(parent_pid, stop))
    trim = Periodic("return-freed-memory", return_freed_memory, TRIM_INTERVAL_S)
    trim.start()
    try:
        await stop.wait()
    finally:
        watch.cancel()
        await trim.stop()
        await server.close()
        await embedder.close()
        await heartbeat.stop()


def main(argv: list[str]) -> int:
    path, parent_pid = argv[0], int(argv[1])
    heartbeat_fd = int(argv[2]) if len(argv) > 2 else -1
    settings = build_settings(env={}, config_file="-")  # the serving process's settings, on stdin
    configure(settings.observability.log_level, settings.observability.log_format)
    limit_malloc_arenas()
    heartbeat = Heartbeat(heartbeat_fd, settings.server.child_stall_seconds)
    asyncio.run(_serve(settings, path, parent_pid, heartbeat))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
