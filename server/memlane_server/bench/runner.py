"""Measurement primitives: processes to measure, latency percentiles, concurrent throughput."""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import grpc

from .echo import METHOD


@dataclass
class Latency:
    name: str
    p50_ms: float
    p99_ms: float
    n: int


def percentiles(samples_s: list[float]) -> tuple[float, float]:
    xs = sorted(samples_s)
    p50 = statistics.median(xs)
    p99 = xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]
    return p50 * 1000, p99 * 1000


def measure(name: str, call: Callable[[], object], n: int, warmup: int = 50) -> Latency:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    p50, p99 = percentiles(samples)
    return Latency(name, p50, p99, n)


async def throughput(call: Callable[[], Awaitable[object]], concurrency: int, seconds: float) -> float:
    """Completed calls per second with ``concurrency`` callers in flight."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await call()
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (time.perf_counter() - t0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Process:
    """A child process that reports its port through a file; killed on exit."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start_with_port_file(self, timeout: float = 60.0) -> int:
        with tempfile.TemporaryDirectory() as d:
            port_file = Path(d) / "port"
            self.proc = subprocess.Popen(
                [*self.args, str(port_file)], env=self.env, stdout=subprocess.DEVNULL
            )
            deadline = time.monotonic() + timeout
            while not port_file.exists() or not port_file.read_text():
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"{self.args[:4]} did not start")
                time.sleep(0.02)
            return int(port_file.read_text())

    def start(self, *, stderr: IO[bytes] | None = None) -> None:
        """``stderr``: a file that keeps what the process writes there (else it is thrown away). Not a
        pipe nobody reads: a chatty child (its worker processes share stderr) would block on it."""
        self.proc = subprocess.Popen(
            self.args,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=stderr if stderr is not None else subprocess.DEVNULL,
        )

    def rss_mb(self) -> float:
        """Resident memory of the process and its children (a sidecar's worker processes) added up: pages
        the processes share (the libraries) are counted once per process."""
        assert self.proc is not None
        return sum(_status_mb(pid, "VmRSS:") for pid in [self.proc.pid, *children_of(self.proc.pid)])

    def pss_mb(self) -> float:
        """PSS of the process and its children added up (a page shared by n processes counts 1/n in
        each). It depends on what else runs: a library page shared with a process outside the tree (the
        bench's own, another sidecar) counts only in part. ``pod_mb`` does not."""
        assert self.proc is not None
        return sum(_rollup_mb(pid, "Pss:") for pid in [self.proc.pid, *children_of(self.proc.pid)])

    def pod_mb(self) -> float:
        """What the process and its children hold together, as a container of their own would be charged
        for them: every private page, and each file page (libraries, the model file) once, whoever else on
        the machine maps it. The memory rows' figure."""
        assert self.proc is not None
        return tree_mb([self.proc.pid, *children_of(self.proc.pid)])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _status_mb(pid: int, field: str, name: str = "status") -> float:
    try:
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    except OSError:  # gone meanwhile
        pass
    return 0.0


def _rollup_mb(pid: int, field: str) -> float:
    return _status_mb(pid, field, "smaps_rollup")


def tree_mb(pids: list[int]) -> float:
    """Private (anonymous) resident memory of ``pids`` added up, plus their file-backed resident pages with
    each mapping of a file counted once (the processes start by exec, so they share no private pages)."""
    private = 0
    files: dict[tuple[str, str], int] = {}  # (inode, offset) -> resident kB of that file mapping
    for pid in pids:
        key: tuple[str, str] | None = None
        rss = 0
        try:
            lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
        except OSError:  # gone meanwhile
            continue
        for line in lines:
            parts = line.split()
            if len(parts) >= 5 and "-" in parts[0] and not parts[0].endswith(":"):
                inode = parts[4]
                key = (inode, parts[2]) if inode != "0" else None
            elif parts[0] == "Rss:":
                rss = int(parts[1])
            elif parts[0] == "Anonymous:":
                anon = int(parts[1])
                private += anon if key is not None else rss
                if key is not None:
                    files[key] = max(files.get(key, 0), rss - anon)
    return (private + sum(files.values())) / 1024


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a sidecar's worker processes), from /proc (Linux)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def start_echo() -> tuple[Process, str]:
    p = Process([sys.executable, "-m", "memlane_server.bench.echo"])
    port = p.start_with_port_file()
    return p, f"127.0.0.1:{port}"


def echo_call(channel: grpc.Channel, payload: bytes) -> Callable[[], object]:
    stub = channel.unary_unary(METHOD)
    return lambda: stub(payload, timeout=10)


def aio_echo_call(channel: grpc.aio.Channel, payload: bytes) -> Callable[[], Awaitable[object]]:
    stub = channel.unary_unary(METHOD)
    return lambda: stub(payload, timeout=10)
