"""How the bench measures and tells: the processes it measures (the bare echo baseline among them),
latency percentiles and concurrent throughput, and the report its rows go into.

**The baseline.** A bare grpc.aio unary echo server (raw bytes, no interceptors, no protobuf). Run as
``python -m memlane_server.bench.runner PORTFILE``; it writes its port to PORTFILE and serves until
killed, so it runs in its own process exactly like the sidecar it is compared with.

**The report.** One row per figure, each with its target and whether this run met it. Latency rows
carry p50/p99 and the echo round trip measured just before them (the machine is noisy: ratios drift far
less than absolute times); rate and memory rows carry one value. ``--json`` writes the rows with their
verdicts; ``--compare REF.json`` prints each figure's ratio to an earlier run.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TextIO

import grpc


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
        return sum(rollup_mb(pid, "Pss:") for pid in [self.proc.pid, *children_of(self.proc.pid)])

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


def rollup_mb(pid: int, field: str) -> float:
    """A field of /proc/PID/smaps_rollup in MB (0 once the process is gone)."""
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
    p = Process([sys.executable, "-m", "memlane_server.bench.runner"])
    port = p.start_with_port_file()
    return p, f"127.0.0.1:{port}"


def echo_call(channel: grpc.Channel, payload: bytes) -> Callable[[], object]:
    stub = channel.unary_unary(METHOD)
    return lambda: stub(payload, timeout=10)


def aio_echo_call(channel: grpc.aio.Channel, payload: bytes) -> Callable[[], Awaitable[object]]:
    stub = channel.unary_unary(METHOD)
    return lambda: stub(payload, timeout=10)


# The baseline: a bare echo server, run as a process of its own (see the module's docstring).

METHOD = "/bench.Echo/Echo"


async def _echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


async def serve(port_file: Path) -> None:
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(_echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await asyncio.to_thread(port_file.write_text, str(port))
    await server.wait_for_termination()


# The report.


@dataclass
class Row:
    name: str
    unit: str  # "ms" (value is the p50), "/s" or "MB"
    value: float
    p99_ms: float = 0.0
    echo_p50_ms: float = 0.0
    target: str = ""
    met: bool | None = None  # None: a figure without a target
    ratio: float = 0.0  # a rate's fraction of the reference rate it is judged against
    note: str = ""


@dataclass
class Report:
    machine: str
    started: str
    rows: list[Row] = field(default_factory=list)

    def latency(
        self,
        lat: Latency,
        echo: Latency | None = None,
        *,
        p50_x: float = 0.0,
        p99_x: float = 0.0,
        p50_ms: float = 0.0,
        p99_ms: float = 0.0,
        like: str = "",
        note: str = "",
    ) -> Row:
        """A latency row; targets as multiples of the echo (``*_x``) or absolute (``*_ms``)."""
        base = echo.p50_ms if echo else 0.0
        goals: list[tuple[str, bool]] = []
        if p50_x:
            goals.append((f"p50 <= {p50_x:g}x echo", lat.p50_ms <= p50_x * base))
        if p99_x and echo is not None:
            goals.append((f"p99 <= {p99_x:g}x echo p99", lat.p99_ms <= p99_x * echo.p99_ms))
        if p50_ms:
            goals.append((f"p50 <= {p50_ms:g} ms", lat.p50_ms <= p50_ms))
        if p99_ms:
            goals.append((f"p99 <= {p99_ms:g} ms", lat.p99_ms <= p99_ms))
        ref = self.get(like) if like else None
        if ref is not None and ref.echo_p50_ms and base:
            # "No slower than" another row measured in another process: compared as ratios to each
            # one's echo, with 10% for the noise between two series.
            ok = lat.p50_ms / base <= 1.1 * ref.value / ref.echo_p50_ms
            goals.append((f"p50 / echo <= 1.1x that of {like!r}", ok))
        row = Row(lat.name, "ms", lat.p50_ms, lat.p99_ms, base, note=note)
        self._judge(row, goals)
        print(f"  {lat.name}: p50 {lat.p50_ms:.3f} ms, p99 {lat.p99_ms:.3f} ms", file=sys.stderr, flush=True)
        return row

    def rate(self, name: str, per_s: float, *, at_least: float = 0.0, of: str = "", note: str = "") -> Row:
        """A rate; ``at_least`` is absolute, or a fraction of the row named ``of`` (the echo's rate)."""
        row = Row(name, "/s", per_s, note=note)
        if at_least and of:
            ref = self.get(of)
            row.ratio = per_s / ref.value if ref and ref.value else 0.0
            self._judge(row, [(f">= {at_least:g}x {of}", row.ratio >= at_least)])
        elif at_least:
            self._judge(row, [(f">= {at_least:g}/s", per_s >= at_least)])
        else:
            self.rows.append(row)
        print(f"  {name}: {per_s:.1f}/s", file=sys.stderr, flush=True)
        return row

    def memory(self, name: str, mb: float, *, at_most: float, note: str = "") -> Row:
        row = Row(name, "MB", mb, note=note)
        self._judge(row, [(f"<= {at_most:g} MB", mb <= at_most)])
        print(f"  {name}: {mb:.0f} MB", file=sys.stderr, flush=True)
        return row

    def _judge(self, row: Row, goals: list[tuple[str, bool]]) -> None:
        if goals:
            row.target = ", ".join(text for text, _ in goals)
            row.met = all(ok for _, ok in goals)
        self.rows.append(row)

    def get(self, name: str) -> Row | None:
        return next((r for r in self.rows if r.name == name), None)

    @property
    def targets(self) -> tuple[int, int]:
        """(met, judged)."""
        judged = [r for r in self.rows if r.met is not None]
        return sum(1 for r in judged if r.met), len(judged)

    def print(self, out: TextIO = sys.stdout, compare: Report | None = None) -> None:
        w = out.write
        w(f"memlane bench, {self.started}, {self.machine}\n\n")
        extra = " vs ref |" if compare else ""
        w(f"| measure | p50 ms / value | p99 ms | p50 / echo | target |{extra}\n")
        w("|---|---:|---:|---:|---|" + ("---:|" if compare else "") + "\n")
        for r in self.rows:
            verdict = "" if r.met is None else (" (met)" if r.met else " (MISSED)")
            value = f"{r.value:.3f}" if r.unit == "ms" else f"{r.value:.1f}{r.unit}"
            p99 = f"{r.p99_ms:.3f}" if r.p99_ms else ""
            x = f"{r.value / r.echo_p50_ms:.2f}x" if r.unit == "ms" and r.echo_p50_ms else ""
            x = f"{r.ratio:.2f}x" if r.ratio else x
            note = f" {r.note}" if r.note else ""
            line = f"| {r.name}{note} | {value} | {p99} | {x} | {r.target}{verdict} |"
            if compare is not None:
                line += f" {_versus(r, compare.get(r.name))} |"
            w(line + "\n")
        met, judged = self.targets
        w(f"\n{met} of {judged} targets met\n")

    def to_json(self) -> str:
        met, judged = self.targets
        return json.dumps({**asdict(self), "targets_met": met, "targets_judged": judged}, indent=2)


def _versus(row: Row, ref: Row | None) -> str:
    """This figure over the reference's (for ms rows, the ratios to each run's own echo, when both
    have one: that cancels most of the machine's drift between the runs)."""
    if ref is None or not ref.value:
        return ""
    raw = f"{row.value / ref.value:.2f}x"
    if row.unit == "ms" and row.echo_p50_ms and ref.echo_p50_ms:
        return (
            f"{(row.value / row.echo_p50_ms) / (ref.value / ref.echo_p50_ms):.2f}x echo-relative ({raw} raw)"
        )
    return raw


def load(path: str) -> Report:
    """A report written by ``--json`` (this version's format)."""
    raw = json.loads(Path(path).read_text())
    rows = [Row(**{k: v for k, v in r.items() if k in Row.__dataclass_fields__}) for r in raw.get("rows", [])]
    return Report(machine=str(raw.get("machine", "")), started=str(raw.get("started", "")), rows=rows)


if __name__ == "__main__":
    asyncio.run(serve(Path(sys.argv[1])))
