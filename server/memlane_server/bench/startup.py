"""The start-up row: ``memlane serve`` with its defaults (embedded Redis, long-term memory on, a fresh
data directory) from process start until its gRPC health service answers SERVING."""

from __future__ import annotations

import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .report import Report
from .runner import Latency, Process, free_port, percentiles

TARGET_S = 3.0


def _one(data_dir: str, port: int) -> float:
    target = f"127.0.0.1:{port}"
    args = ["--listen", target, "--admin-listen", "", "--data-dir", data_dir, "--log-level", "WARNING"]
    proc = Process([sys.executable, "-m", "memlane_server.cli", "serve", *args])
    t0 = time.perf_counter()
    proc.start()
    try:
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
    finally:
        proc.stop()


def startup(report: Report, data_root: str, runs: int) -> None:
    samples = [_one(f"{data_root}/{k}", free_port()) for k in range(runs)]
    p50, p99 = percentiles(samples)
    report.latency(
        Latency(f"memlane serve start to healthy (embedded Redis, LTM on), {runs} starts", p50, p99, runs),
        p50_ms=TARGET_S * 1000,
    )
