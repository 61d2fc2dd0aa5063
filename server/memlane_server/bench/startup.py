"""The start-up row: ``memlane serve`` with its defaults (embedded Redis, long-term memory on, a fresh
data directory) from process start until its gRPC health service answers SERVING."""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .report import Report
from .runner import Latency, Process, children_of, free_port, percentiles

IDLE_SETTLE_S = 8.0  # after the worker started: its start-up (imports, table, Redis) is over by then

TARGET_S = 3.0


def _one(data_dir: str, port: int, *, idle_memory: bool = False) -> tuple[float, float, str]:
    """Seconds to healthy; with ``idle_memory``, the memory of every process (``Process.pod_mb``) once the
    workers are up and have been idle a few seconds (else 0). Also what the start wrote on stderr besides
    log lines."""
    target = f"127.0.0.1:{port}"
    args = ["--listen", target, "--admin-listen", "", "--data-dir", data_dir, "--log-format", "json"]
    proc = Process([sys.executable, "-m", "memlane_server.cli", "serve", *args])
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc.start(stderr=err)
        try:
            took = _healthy(proc, target, t0)
            pss = 0.0
            if idle_memory:
                _workers_running(proc)
                time.sleep(IDLE_SETTLE_S)
                pss = proc.pod_mb()
        finally:
            proc.stop()
        err.seek(0)
        others = [line for line in err.read().decode(errors="replace").splitlines() if not _log_line(line)]
    return took, pss, "\n".join(others)


def _healthy(proc: Process, target: str, t0: float) -> float:
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = t0 + 60
        while True:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=0.5)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return time.perf_counter() - t0
            except grpc.RpcError:
                pass
            if time.perf_counter() > deadline or (proc.proc and proc.proc.poll() is not None):
                raise RuntimeError("memlane serve did not become healthy")
            time.sleep(0.02)


def _workers_running(proc: Process) -> None:
    """Until the worker process has loaded what it loads (its memory is then what it idles at)."""
    assert proc.proc is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        kids = children_of(proc.proc.pid)
        if any(b"memlane_server.cli" in Path(f"/proc/{k}/cmdline").read_bytes() for k in kids):
            return
        time.sleep(0.1)


def _log_line(line: str) -> bool:
    """A JSON log line at info level (or the auth notice every development start gives)."""
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and (
        record.get("level") in ("debug", "info") or str(record.get("msg", "")).startswith("auth is disabled")
    )


def startup(report: Report, data_root: str, runs: int) -> None:
    results = [_one(f"{data_root}/{k}", free_port(), idle_memory=k == runs - 1) for k in range(runs)]
    p50, p99 = percentiles([took for took, _, _ in results])
    noise = next((err for _, _, err in results if err), "")
    report.latency(
        Latency(f"memlane serve start to healthy (embedded Redis, LTM on), {runs} starts", p50, p99, runs),
        p50_ms=TARGET_S * 1000,
        note=f"stderr besides log lines: {noise[:300]!r}" if noise else "nothing on stderr but log lines",
    )
    report.memory(
        "memory of a default memlane serve, idle, LTM on (all processes, each page once)",
        results[-1][1],
        at_most=350,
    )
