"""The benchmark suite: real sidecar processes (real Redis, model, LanceDB on disk) and a bare echo
process; each figure printed with its ratio to the echo round trip measured just before it.

Long-term memory for the recall rows is synthetic (``populate``, below): written straight into a LanceDB
directory before the sidecar starts (embedding 100k texts would take many minutes and other users'
content does not change one user's prefiltered query). Vectors are random unit vectors; the measured
queries still go through the sidecar's real model.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from tqdm import tqdm

import memlane
from memlane import Message, MessageOrder, Role
from memlane.v1 import memory_pb2, session_service_pb2

from ..keyspace import drop_keys
from ..ltm import LanceMemoryStore, MemoryItem, MemoryKind, MemoryScope
from .overload import flood, huge_call, overload
from .processes import isolation, session_end, startup
from .runner import (
    Latency,
    Process,
    Report,
    aio_echo_call,
    echo_call,
    free_port,
    load,
    measure,
    start_echo,
    throughput,
)

TEXT = "Please book the 9:40 train to Lyon for two adults and email the tickets. " * 2


class Sidecar:
    """A ``memlane serve`` child process on a free port, with its own data directory."""

    def __init__(self, data_dir: str, redis_url: str, *flags: str) -> None:
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.admin_port = free_port()  # /metrics: the rows that count what the sidecar did read it
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
                f"127.0.0.1:{self.admin_port}",
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

    def counter(self, name: str, **labels: str) -> float:
        """A counter of this sidecar's /metrics (its workers' merged in), summed over the other labels."""
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/metrics", timeout=10).read()
        total = 0.0
        for family in text_string_to_metric_families(body.decode()):
            for sample in family.samples:
                if sample.name == f"{name}_total" and labels.items() <= sample.labels.items():
                    total += sample.value
        return total

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


NO_LTM_ASSEMBLY = "AssembleContext (200 messages, no LTM)"
REFUSED_BATCH = "AppendMessages refused: 100,000 one-character messages"
ECHO_RATE = "echo, 32 in flight"


def run(quick: bool, redis_url: str, json_out: str | None, compare: str | None = None) -> Report:
    n = 200 if quick else 2000
    sizes = (2_000, 10_000) if quick else (10_000, 100_000)
    assemble_user_items = 1_000 if quick else 10_000
    seconds = 2.0 if quick else 8.0
    reference = load(compare) if compare else None
    report = Report(
        machine=f"{os.cpu_count()} cores, {sys.platform}, python {sys.version.split()[0]}",
        started=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    )
    # One step per phase; a bar on a terminal only (disable=None), figures still go to stderr as they come.
    phases = tqdm(
        total=2 + 2 * len(sizes) + 6 + (0 if quick else 1), desc="bench", unit="phase", disable=None
    )
    with _echo() as echo, tempfile.TemporaryDirectory(prefix="memlane-bench-") as tmp, phases:
        phases.set_postfix_str("start-up")
        startup(report, f"{tmp}/startup", 3 if quick else 5)
        phases.update()
        phases.set_postfix_str("core RPCs")
        with Sidecar(f"{tmp}/core", redis_url, "--ltm-enabled", "false") as core:
            _core(report, core.target, echo, n, seconds)
            report.memory(
                "memory after load (all processes, each page once): sidecar without LTM",
                core.proc.pod_mb(),
                at_most=200,
                note=f"PSS {core.proc.pss_mb():.0f} MB, RSS added up {core.proc.rss_mb():.0f} MB",
            )
        phases.update()
        for size in sizes:
            data = f"{tmp}/ltm{size}"
            last = size == sizes[-1]
            users = {"searcher": 100, "assembler": assemble_user_items} if last else {"searcher": 100}
            phases.set_postfix_str(f"populate {size:,} items")
            populate(f"{data}/ltm", size, users)
            phases.update()
            with Sidecar(data, redis_url) as ltm:
                phases.set_postfix_str(f"search {size:,}")
                _search(report, ltm.target, echo, n // 2, size)
                phases.update()
                if last:
                    phases.set_postfix_str("assemble with LTM")
                    _assemble_with_ltm(
                        report, ltm.target, echo, n // 2, user_items=assemble_user_items, size=size
                    )
                    phases.update()
                    phases.set_postfix_str("session end")
                    session_end(report, ltm.target, 6 if quick else 24, texts=ltm.counter)
                    phases.update()
                    phases.set_postfix_str("load")
                    overload(report, echo, ltm.target, "assembler", seconds)
                    phases.update()
                    phases.set_postfix_str("isolation")
                    isolation(report, ltm.target)
                    phases.update()
                    phases.set_postfix_str("embedding limits")
                    huge_call(report, ltm.target)
                    flood(report, ltm.target, "searcher", seconds)
                    phases.update()
                    report.memory(
                        "memory after load (all processes, each page once): sidecar with LTM"
                        f" ({size:,} items)",
                        ltm.proc.pod_mb(),
                        at_most=500,
                        note=f"PSS {ltm.proc.pss_mb():.0f} MB, RSS added up {ltm.proc.rss_mb():.0f} MB",
                    )
        phases.set_postfix_str("thin serving process")
        _thin(
            report,
            f"{tmp}/thin",
            redis_url=redis_url,
            ltm=f"{tmp}/ltm{sizes[-1]}/ltm",
            echo=echo,
            seconds=seconds,
        )
        phases.update()
        if not quick:  # the same session-end row with two worker processes (1 is the default above)
            phases.set_postfix_str("session end, 2 workers")
            with Sidecar(f"{tmp}/two-workers", redis_url, "--worker-processes", "2") as two:
                session_end(report, two.target, 24, label="2 worker processes")
            phases.update()
    report.print(compare=reference)
    if json_out:
        Path(json_out).write_text(report.to_json())
    return report


def _thin(
    report: Report, data: str, *, redis_url: str, ltm: str, echo: Callable[[int], Latency], seconds: float
) -> None:
    """The serving process alone, as a thin sidecar of the worker-Deployment topology runs it (no worker
    processes, no background jobs), on the largest table, after the load rows' traffic."""
    flags = ("--worker-processes", "0", "--pipeline-enabled", "false", "--ltm-uri", ltm)
    with Sidecar(data, redis_url, *flags) as thin:
        overload(report, echo, thin.target, "assembler", seconds, label="thin serving process")
        assert thin.proc.proc is not None
        report.memory(
            "memory after load: the serving process alone (thin sidecar: no workers, pipeline off; RSS)",
            thin.proc.rss_mb(),
            at_most=200,
            note=f"PSS {thin.proc.pss_mb():.0f} MB",
        )


def _core(report: Report, target: str, echo: Callable[[int], Latency], n: int, seconds: float) -> None:
    with memlane.Client(target) as c:
        sid = c.create_session(user_id="bench-user").session.session_id
        c.append_messages(
            session_id=sid, messages=[Message(role=Role.ROLE_USER, content=TEXT) for _ in range(50)]
        )
        base = echo(n)
        report.latency(
            measure(
                "AppendMessages (1 message, session of 50)",
                lambda: c.append_messages(
                    session_id=sid, messages=[Message(role=Role.ROLE_USER, content=TEXT)]
                ),
                n,
            ),
            base,
            p50_x=1.3,
            p99_x=2,
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
        report.latency(
            measure("ListMessages (last 20 of 200)", lambda: c.list_messages(req), n), base, p50_x=1.5
        )
        base = echo(n)
        report.latency(
            measure(REFUSED_BATCH, _refuse_batch(c, sid), 5 if n < 1000 else 20, warmup=1),
            base,
            note="the count is checked before conversion (2.0 s before that); tests/integration/"
            "test_hostile_payloads.py checks the order",
        )
        base = echo(n)
        report.latency(
            measure(
                NO_LTM_ASSEMBLY,
                lambda: list(
                    c.assemble_context(session_id=sid200, user_input="which train?", model="gpt-4o")
                ),
                n,
            ),
            base,
            p50_x=2.5,
        )
    rates = asyncio.run(_throughput(target, seconds))
    report.rate(f"throughput: {ECHO_RATE}", rates[ECHO_RATE])
    report.rate(
        "throughput: AppendMessages, 32 in flight",
        rates["append"],
        at_least=0.8,
        of=f"throughput: {ECHO_RATE}",
    )


def _refuse_batch(c: memlane.Client, sid: str) -> Callable[[], object]:
    """One AppendMessages of 100,000 one-character messages, refused (BATCH_TOO_LARGE): encoding and
    decoding the 700 KB request is most of it."""
    tiny = [Message(role=Role.ROLE_USER, content="x")] * 100_000

    def refuse() -> None:
        try:
            c.append_messages(session_id=sid, messages=tiny)
        except memlane.ResourceExhaustedError:
            return
        raise RuntimeError("a batch of 100,000 messages was accepted")

    return refuse


async def _throughput(target: str, seconds: float) -> dict[str, float]:
    out: dict[str, float] = {}
    proc, echo_target = start_echo()
    try:
        async with grpc.aio.insecure_channel(echo_target) as ch:
            out[ECHO_RATE] = await throughput(aio_echo_call(ch, TEXT.encode()), 32, seconds)
    finally:
        proc.stop()
    async with memlane.AsyncClient(target) as c:
        sid = (await c.create_session(user_id="bench-user")).session.session_id

        async def append() -> object:
            return await c.append_messages(
                session_id=sid, messages=[Message(role=Role.ROLE_USER, content=TEXT)]
            )

        out["append"] = await throughput(append, 32, seconds)
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
        report.latency(
            measure(f"SearchMemories ({size:,} items, 100 the user's)", search, n, warmup=20),
            base,
            p50_ms=10,
        )


def _assemble_with_ltm(
    report: Report, target: str, echo: Callable[[int], Latency], n: int, *, user_items: int, size: int
) -> None:
    with memlane.Client(target) as c:
        for user, items in (("nobody", 0), ("assembler", user_items)):
            sid = c.create_session(user_id=user, agent_id="bench-agent").session.session_id
            # The empty user's turns are scratch: learning during the session would otherwise give that
            # user memories within seconds, and the row would time promotion, not an empty recall.
            turn = Message(role=Role.ROLE_ASSISTANT, content=TEXT, transient=not items)
            for _ in range(4):
                c.append_messages(session_id=sid, messages=[turn] * 50)
            name = (
                f"AssembleContext (200 messages, {items:,} of {size:,} LTM items)"
                if items
                else "AssembleContext (200 messages, LTM on, a user with no memories)"
            )
            base = echo(n)
            lat = measure(name, _assembly(c, sid), n, warmup=20)
            if items:
                report.latency(lat, base, p50_ms=15, p99_ms=40)
            else:
                report.latency(lat, base, like=NO_LTM_ASSEMBLY)


def _assembly(c: memlane.Client, sid: str) -> Callable[[], object]:
    i = iter(range(10**9))  # a new query text each call: the query cache must not help
    return lambda: list(
        c.assemble_context(session_id=sid, user_input=f"coffee order {next(i)}?", model="gpt-4o")
    )


# Synthetic long-term memory (see the module's docstring).

TOPICS = ("hiking", "coffee", "Pune", "metric units", "Postgres", "cello", "SKU-4411-B", "vegan", "chess")
NDIMS = 384  # all-MiniLM-L6-v2, the default model


# The product caps non-episodic items at 200 per (user, agent) (ltm_max_items_per_agent); a user's
# other items are episodes. The synthetic data keeps to the same shape.
FACTS_PER_USER = 200


def items(user: str, n: int, rng: np.random.Generator, start: int = 0) -> list[MemoryItem]:
    vecs = rng.standard_normal((n, NDIMS)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    now = int(time.time() * 1000)
    return [
        MemoryItem(
            id=f"{user}-{start + i}",
            user_id=user,
            agent_id="bench-agent",
            scope=MemoryScope.USER,
            kind=MemoryKind.FACT if start + i < FACTS_PER_USER else MemoryKind.EPISODIC,
            content=f"{user} note {start + i}: about {TOPICS[i % len(TOPICS)]}, order {(start + i) * 7}",
            created_at_ms=now,
            updated_at_ms=now,
            occurred_at_ms=now,
            vector=vecs[i].tolist(),
        )
        for i in range(n)
    ]


def filler(n: int, users: int, rng: np.random.Generator, start: int = 0) -> list[MemoryItem]:
    """``n`` items spread over ``users`` other users (``filler0`` ...)."""
    rows = items("filler", n, rng, start)
    for j, row in enumerate(rows):
        row.user_id = f"filler{(start + j) % users}"
    return rows


async def _populate(uri: str, total: int, users: dict[str, int]) -> None:
    """``users`` items for each named user, and filler users up to ``total`` rows."""
    rng = np.random.default_rng(7)
    store = await LanceMemoryStore.open(uri, NDIMS)
    for user, n in users.items():
        await store.add(items(user, n, rng))
    rest, filler_users = total - sum(users.values()), max(1, total // 100)
    for start in range(0, rest, 20_000):
        await store.add(filler(min(20_000, rest - start), filler_users, rng, start))
    await store.optimize()
    store.close()


def populate(uri: str, total: int, users: dict[str, int]) -> None:
    asyncio.run(_populate(uri, total, users))
