"""The embedding rows: what one caller's embedding work can cost everyone else.

- one ``Embed`` call of 250 texts of 63 KB (the call that held the model for up to a minute): refused
  at once by its cost limit, or answered, within a second;
- four callers flooding ``Embed`` (128 texts of 2 KB each, as fast as they are served) while another user
  searches (a query embedding each), health is probed and another session appends: the search, the probe
  and the append keep their figures.
"""

from __future__ import annotations

import asyncio
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import memlane
from memlane import Message, Role
from memlane.v1 import memory_pb2

from .report import Report
from .runner import Latency, percentiles

FLOODERS = 4
SENTENCE = "The quarterly report lists every shipment we sent to the northern warehouses last spring. "


def _text(tag: str, chars: int) -> str:
    return (f"{tag}: " + SENTENCE * (chars // len(SENTENCE) + 1))[:chars]


def huge_call(report: Report, target: str) -> None:
    texts = [_text(f"huge {i}", 63 * 1024) for i in range(250)]
    with memlane.Client(target, timeout=300, retry=memlane.NO_RETRY) as c:
        t0 = time.perf_counter()
        try:
            c.embed(texts=texts)
            outcome = "answered"
        except memlane.ResourceExhaustedError as exc:
            outcome = f"refused ({exc.reason})"
        took = time.perf_counter() - t0
    report.latency(
        Latency("Embed of 250 texts of 63 KB (refused or answered)", took * 1000, took * 1000, 1),
        p99_ms=1000,
        note=outcome,
    )


async def _flood(target: str, searcher: str, seconds: float) -> dict[str, list[float] | int]:
    search_s: list[float] = []
    health_s: list[float] = []
    append_s: list[float] = []
    counts = {"ok": 0, "shed": 0}
    deadline = time.perf_counter() + seconds
    async with (
        memlane.AsyncClient(target, timeout=120, retry=memlane.NO_RETRY) as c,
        grpc.aio.insecure_channel(target) as channel,
    ):
        probe = health_pb2_grpc.HealthStub(channel)
        live = (await c.create_session(user_id="embed-flood-live", agent_id="bench-agent")).session.session_id
        caller = memory_pb2.Caller(user_id=searcher, agent_id="bench-agent")

        async def flooder(k: int) -> None:
            i = 0
            while time.perf_counter() < deadline:
                i += 1
                try:
                    await c.embed(texts=[_text(f"flood {k}-{i}-{j}", 2048) for j in range(128)])
                    counts["ok"] += 1
                except memlane.ResourceExhaustedError:
                    counts["shed"] += 1
                    await asyncio.sleep(0.05)

        async def others() -> None:
            n = 0
            while time.perf_counter() < deadline:
                n += 1
                t0 = time.perf_counter()
                await c.search_memories(caller=caller, query=f"which shipment, question {n}?", limit=10)
                search_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await probe.Check(health_pb2.HealthCheckRequest(), timeout=30)
                health_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await c.append_messages(
                    session_id=live, messages=[Message(role=Role.ROLE_USER, content="hi")]
                )
                append_s.append(time.perf_counter() - t0)
                await asyncio.sleep(0.02)

        await asyncio.gather(*(flooder(k) for k in range(FLOODERS)), others())
    return {"search": search_s, "health": health_s, "append": append_s, **counts}


def flood(report: Report, target: str, searcher: str, seconds: float) -> None:
    out = asyncio.run(_flood(target, searcher, seconds))
    search, health, append = out["search"], out["health"], out["append"]
    assert isinstance(search, list) and isinstance(health, list) and isinstance(append, list)
    note = f"Embed calls answered {out['ok']}, refused {out['shed']}"
    p50, p99 = percentiles(search)
    name = f"SearchMemories of another user while {FLOODERS} callers flood Embed"
    report.latency(Latency(name, p50, p99, len(search)), p50_ms=150, note=note)
    worst = max(search) * 1000  # Latency holds milliseconds
    report.latency(Latency(f"{name} (max)", worst, worst, len(search)), p99_ms=1000)
    worst = max(health) * 1000
    report.latency(Latency("health probe during that flood (max)", worst, worst, len(health)), p99_ms=1000)
    p50, p99 = percentiles(append)
    report.latency(Latency("AppendMessages during that flood", p50, p99, len(append)), p99_ms=100)
