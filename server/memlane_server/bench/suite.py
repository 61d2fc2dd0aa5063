"""The benchmark suite: real sidecar processes (real Redis, model, LanceDB on disk) and a bare echo
process; each figure printed with its ratio to the echo round trip measured just before it."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
from tqdm import tqdm

import memlane
from memlane import Message, MessageOrder, Role
from memlane.v1 import memory_pb2, session_service_pb2

from ..sessions.scratch import drop_keys
from .ltm_data import populate
from .overload import overload
from .runner import Latency, Process, aio_echo_call, echo_call, measure, start_echo, throughput

TEXT = "Please book the 9:40 train to Lyon for two adults and email the tickets. " * 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Row:
    name: str
    p50_ms: float
    p99_ms: float
    echo_p50_ms: float
    target: str = ""  # e.g. "<= 1.5x echo", "<= 20 ms"
    met: bool | None = None


@dataclass
class Report:
    machine: str
    started: str
    rows: list[Row] = field(default_factory=list)
    throughput: dict[str, float] = field(default_factory=dict)
    rss_mb: dict[str, float] = field(default_factory=dict)

    def add(self, lat: Latency, echo: Latency, *, ratio: float = 0.0, ms: float = 0.0) -> None:
        row = Row(lat.name, lat.p50_ms, lat.p99_ms, echo.p50_ms)
        if ratio:
            row.target, row.met = f"p50 <= {ratio:g}x echo", lat.p50_ms <= ratio * echo.p50_ms
        elif ms:
            row.target, row.met = f"p50 <= {ms:g} ms", lat.p50_ms <= ms
        self.rows.append(row)
        print(f"  {lat.name}: p50 {lat.p50_ms:.3f} ms", file=sys.stderr, flush=True)

    def print(self) -> None:
        w = sys.stdout.write
        w(f"memlane bench, {self.started}, {self.machine}\n\n")
        w("| measure | p50 ms | p99 ms | p50 / echo | target |\n|---|---:|---:|---:|---|\n")
        for r in self.rows:
            verdict = "" if r.met is None else (" (met)" if r.met else " (missed)")
            w(
                f"| {r.name} | {r.p50_ms:.3f} | {r.p99_ms:.3f} | {r.p50_ms / r.echo_p50_ms:.2f}x "
                f"| {r.target}{verdict} |\n"
            )
        echo_rps = self.throughput.get("echo, 32 in flight", 0.0)
        for name, rps in self.throughput.items():
            ratio = f"{rps / echo_rps:.2f}x echo" if echo_rps else ""
            goal = ">= 0.7x echo" if "Append" in name else ""
            w(f"| throughput: {name} | {rps:.0f}/s | | {ratio} | {goal} |\n")
        for name, mb in self.rss_mb.items():
            verdict = "met" if mb <= 500 else "missed"
            w(f"| RSS after load: {name} | {mb:.0f} MB | | | <= 500 MB ({verdict}) |\n")


class Sidecar:
    """A ``memlane serve`` child process on a free port, with its own data directory."""

    def __init__(self, data_dir: str, redis_url: str, *flags: str) -> None:
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.redis_url, self.key_prefix = redis_url, f"bench{self.port}"
        self.proc = Process(
            [
                sys.executable,
                "-m",
                "memlane_server.cli",
                "serve",
                "--listen",
                self.target,
                "--admin-listen",
                "",
                "--data-dir",
                data_dir,
                "--redis-url",
                redis_url,
                "--key-prefix",
                self.key_prefix,
                "--log-level",
                "WARNING",
                *flags,
            ]
        )

    def __enter__(self) -> Sidecar:
        self.proc.start()
        deadline = time.monotonic() + 120
        with memlane.Client(self.target, timeout=2, retry=memlane.NO_RETRY) as c:
            while True:
                try:
                    c.get_session(session_id="ready-probe")
                except memlane.NotFoundError:
                    return self
                except memlane.MemlaneError:
                    if time.monotonic() > deadline or (self.proc.proc and self.proc.proc.poll() is not None):
                        raise RuntimeError("the sidecar did not start") from None
                    time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        self.proc.stop()
        if self.redis_url:  # a user's Redis: leave it as we found it (an embedded one goes with tmp)
            drop_keys(self.redis_url, self.key_prefix)


@contextmanager
def _echo() -> Iterator[Callable[[int], Latency]]:
    proc, target = start_echo()
    channel = grpc.insecure_channel(target)
    try:
        yield lambda n: measure("bare grpc echo (baseline)", echo_call(channel, TEXT.encode()), n)
    finally:
        channel.close()
        proc.stop()


def run(quick: bool, redis_url: str, json_out: str | None) -> Report:
    n = 200 if quick else 2000
    sizes = (2_000, 10_000) if quick else (10_000, 100_000)
    assemble_user_items = 1_000 if quick else 10_000
    seconds = 2.0 if quick else 8.0
    report = Report(
        machine=f"{os.cpu_count()} cores, {sys.platform}, python {sys.version.split()[0]}",
        started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    )
    # One step per phase; a bar on a terminal only (disable=None), figures still go to stderr as they come.
    phases = tqdm(total=1 + 2 * len(sizes) + 2, desc="bench", unit="phase", disable=None)
    with _echo() as echo, tempfile.TemporaryDirectory(prefix="memlane-bench-") as tmp, phases:
        phases.set_postfix_str("core RPCs")
        with Sidecar(f"{tmp}/core", redis_url, "--ltm-enabled", "false") as core:
            _core(report, core.target, echo, n, seconds)
            report.rss_mb["sidecar without LTM"] = core.proc.rss_mb()
        phases.update()
        for size in sizes:
            data = f"{tmp}/ltm{size}"
            users = (
                {"searcher": 100, "assembler": assemble_user_items}
                if size == sizes[-1]
                else {"searcher": 100}
            )
            phases.set_postfix_str(f"populate {size:,} items")
            populate(f"{data}/ltm", size, users)
            phases.update()
            with Sidecar(data, redis_url) as ltm:
                phases.set_postfix_str(f"search {size:,}")
                _search(report, ltm.target, echo, n // 2, size)
                phases.update()
                if size == sizes[-1]:
                    phases.set_postfix_str("assemble with LTM")
                    _assemble_with_ltm(
                        report, ltm.target, echo, n // 2, user_items=assemble_user_items, size=size
                    )
                    phases.update()
                    phases.set_postfix_str("session-end pipeline")
                    _pipeline(report, ltm.target, echo, 3 if quick else 10)
                    phases.update()
                    overload(
                        lambda lat: report.add(lat, echo(100)),
                        report.throughput,
                        ltm.target,
                        "assembler",
                        seconds,
                    )
                    report.rss_mb[f"sidecar with LTM ({size:,} items)"] = ltm.proc.rss_mb()
    report.print()
    if json_out:
        Path(json_out).write_text(json.dumps(asdict(report), indent=2))
    return report


def _core(report: Report, target: str, echo: Callable[[int], Latency], n: int, seconds: float) -> None:
    with memlane.Client(target) as c:
        sid = c.create_session(user_id="bench-user").session.session_id
        c.append_messages(
            session_id=sid, messages=[Message(role=Role.ROLE_USER, content=TEXT) for _ in range(50)]
        )
        base = echo(n)
        report.add(
            measure(
                "AppendMessages (1 message, session of 50)",
                lambda: c.append_messages(
                    session_id=sid, messages=[Message(role=Role.ROLE_USER, content=TEXT)]
                ),
                n,
            ),
            base,
            ratio=1.5,
        )
        sid200 = c.create_session(user_id="bench-user").session.session_id
        for _ in range(4):
            c.append_messages(
                session_id=sid200, messages=[Message(role=Role.ROLE_ASSISTANT, content=TEXT)] * 50
            )
        req = session_service_pb2.ListMessagesRequest(
            session_id=sid200, page_size=20, order=MessageOrder.MESSAGE_ORDER_NEWEST_FIRST
        )
        base = echo(n)
        report.add(measure("ListMessages (last 20 of 200)", lambda: c.list_messages(req), n), base)
        base = echo(n)
        report.add(
            measure(
                "AssembleContext (200 messages, no LTM)",
                lambda: list(
                    c.assemble_context(session_id=sid200, user_input="which train?", model="gpt-4o")
                ),
                n,
            ),
            base,
            ratio=3,
        )
    report.throughput.update(asyncio.run(_throughput(target, seconds)))


async def _throughput(target: str, seconds: float) -> dict[str, float]:
    out: dict[str, float] = {}
    proc, echo_target = start_echo()
    try:
        async with grpc.aio.insecure_channel(echo_target) as ch:
            out["echo, 32 in flight"] = await throughput(aio_echo_call(ch, TEXT.encode()), 32, seconds)
    finally:
        proc.stop()
    async with memlane.AsyncClient(target) as c:
        sid = (await c.create_session(user_id="bench-user")).session.session_id

        async def append() -> object:
            return await c.append_messages(
                session_id=sid, messages=[Message(role=Role.ROLE_USER, content=TEXT)]
            )

        out["AppendMessages, 32 in flight"] = await throughput(append, 32, seconds)
    return out


def _search(report: Report, target: str, echo: Callable[[int], Latency], n: int, size: int) -> None:
    topics = ("hiking", "coffee", "Pune", "units", "Postgres", "cello", "SKU-4411-B", "vegan", "chess")
    with memlane.Client(target) as c:
        caller = memory_pb2.Caller(user_id="searcher", agent_id="bench-agent")
        i = iter(range(10**9))  # a new query text each call: the query cache must not help

        def search() -> object:
            k = next(i)
            return c.search_memories(caller=caller, query=f"what about {topics[k % 9]} order {k}?", limit=10)

        base = echo(n)
        report.add(
            measure(f"SearchMemories ({size:,} items, 100 the user's)", search, n, warmup=20), base, ms=20
        )


def _assemble_with_ltm(
    report: Report, target: str, echo: Callable[[int], Latency], n: int, *, user_items: int, size: int
) -> None:
    with memlane.Client(target) as c:
        sid = c.create_session(user_id="assembler", agent_id="bench-agent").session.session_id
        for _ in range(4):
            c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_ASSISTANT, content=TEXT)] * 50)
        i = iter(range(10**9))
        base = echo(n)
        report.add(
            measure(
                f"AssembleContext (200 messages, {user_items:,} of {size:,} LTM items)",
                lambda: list(
                    c.assemble_context(session_id=sid, user_input=f"coffee order {next(i)}?", model="gpt-4o")
                ),
                n,
                warmup=20,
            ),
            base,
            ms=15,
        )


def _pipeline(report: Report, target: str, echo: Callable[[int], Latency], sessions: int) -> None:
    samples = []
    with memlane.Client(target, timeout=300) as c:
        for k in range(sessions):
            sid = c.create_session(user_id=f"pipeline-{k}", agent_id="bench-agent").session.session_id
            turns = [
                Message(
                    role=Role.ROLE_USER if j % 2 == 0 else Role.ROLE_ASSISTANT,
                    content=f"Turn {j}: I prefer window seats; my booking ref is BK{k}{j:03d}.",
                )
                for j in range(50)
            ]
            c.append_messages(session_id=sid, messages=turns)
            t0 = time.perf_counter()
            c.promote_session(session_id=sid, close=True)
            samples.append(time.perf_counter() - t0)
    samples.sort()
    p50, p99 = samples[len(samples) // 2] * 1000, samples[-1] * 1000
    report.add(
        Latency(
            f"session-end pipeline (50 turns: promote + archive), {sessions} sessions", p50, p99, sessions
        ),
        echo(100),
    )
