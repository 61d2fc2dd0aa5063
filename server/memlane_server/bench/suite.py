"""The benchmark suite: starts a real sidecar process and a bare echo process, measures, prints a table."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
import memlane
from memlane import Message, MessageOrder, Role

from .runner import Latency, Process, aio_echo_call, echo_call, measure, start_echo, throughput


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Report:
    machine: str
    echo: Latency
    rows: list[Latency] = field(default_factory=list)
    throughput: dict[str, float] = field(default_factory=dict)
    rss_mb: float = 0.0

    def print(self, out: object = sys.stdout) -> None:
        w = out.write  # type: ignore[attr-defined]
        w(f"machine: {self.machine}\n")
        w(f"{'measure':<44}{'p50 ms':>9}{'p99 ms':>9}{'p50/echo':>10}\n")
        for r in [self.echo, *self.rows]:
            w(f"{r.name:<44}{r.p50_ms:>9.3f}{r.p99_ms:>9.3f}{r.p50_ms / self.echo.p50_ms:>10.2f}\n")
        for name, rps in self.throughput.items():
            w(f"throughput {name:<33}{rps:>9.0f}/s\n")
        if "append (32 clients)" in self.throughput and "echo (32 clients)" in self.throughput:
            ratio = self.throughput["append (32 clients)"] / self.throughput["echo (32 clients)"]
            w(f"{'append throughput / echo throughput':<44}{ratio:>9.2f}\n")
        w(f"{'sidecar RSS after load (MB)':<44}{self.rss_mb:>9.0f}\n")


def _machine() -> str:
    import os

    return f"{os.cpu_count()} cores, {sys.platform}, python {sys.version.split()[0]}"


def run(quick: bool, redis_url: str, json_out: str | None) -> Report:
    n = 300 if quick else 3000
    seconds = 2.0 if quick else 8.0
    with tempfile.TemporaryDirectory(prefix="memlane-bench-") as data:
        port = free_port()
        sidecar = Process(
            [
                sys.executable,
                "-m",
                "memlane_server.cli",
                "serve",
                "--listen",
                f"127.0.0.1:{port}",
                "--admin-listen",
                "",
                "--data-dir",
                data,
                "--redis-url",
                redis_url,
                "--key-prefix",
                f"bench{port}",
                "--log-level",
                "WARNING",
            ]
        )
        sidecar.start()
        echo_proc, echo_target = start_echo()
        try:
            target = f"127.0.0.1:{port}"
            _wait_ready(target, sidecar)
            report = _measure(target, echo_target, n, seconds)
            report.rss_mb = sidecar.rss_mb()
        finally:
            echo_proc.stop()
            sidecar.stop()
    report.print()
    if json_out:
        Path(json_out).write_text(json.dumps(asdict(report), indent=2))
    return report


def _wait_ready(target: str, proc: Process, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with memlane.Client(target, timeout=1, retry=memlane.NO_RETRY) as c:
        while True:
            try:
                c.get_session(session_id="ready-probe")
            except memlane.NotFoundError:
                return
            except memlane.MemlaneError:
                if time.monotonic() > deadline or (proc.proc and proc.proc.poll() is not None):
                    raise RuntimeError("the sidecar did not start") from None
                time.sleep(0.1)


def _measure(target: str, echo_target: str, n: int, seconds: float) -> Report:
    text = "Please book the 9:40 train to Lyon for two adults and email the tickets. " * 2
    with grpc.insecure_channel(echo_target) as ch:
        echo = measure("bare grpc echo (baseline)", echo_call(ch, text.encode()), n)
    report = Report(machine=_machine(), echo=echo)
    with memlane.Client(target) as c:
        sid = c.create_session(user_id="bench-user").session.session_id
        c.append_messages(
            session_id=sid, messages=[Message(role=Role.ROLE_USER, content=text) for _ in range(50)]
        )

        def append() -> object:
            return c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content=text)])

        report.rows.append(measure("AppendMessages (1 msg, session of 50+)", append, n))
        sid200 = c.create_session(user_id="bench-user").session.session_id
        for _ in range(4):
            c.append_messages(
                session_id=sid200, messages=[Message(role=Role.ROLE_ASSISTANT, content=text)] * 50
            )
        req = memlane.v1.session_service_pb2.ListMessagesRequest(
            session_id=sid200, page_size=20, order=MessageOrder.MESSAGE_ORDER_NEWEST_FIRST
        )
        report.rows.append(measure("ListMessages (last 20 of 200)", lambda: c.list_messages(req), n))
    report.throughput.update(asyncio.run(_throughput(target, echo_target, text, seconds)))
    return report


async def _throughput(target: str, echo_target: str, text: str, seconds: float) -> dict[str, float]:
    out: dict[str, float] = {}
    async with grpc.aio.insecure_channel(echo_target) as ch:
        out["echo (32 clients)"] = await throughput(aio_echo_call(ch, text.encode()), 32, seconds)
    async with memlane.AsyncClient(target) as c:
        sid = (await c.create_session(user_id="bench-user")).session.session_id

        async def append() -> object:
            return await c.append_messages(
                session_id=sid, messages=[Message(role=Role.ROLE_USER, content=text)]
            )

        out["append (32 clients)"] = await throughput(append, 32, seconds)
    return out
