"""The load rows: what callers who ask for more than the sidecar can serve cost everyone else.

**Overload.** 32 clients each appending then assembling (with LTM) as fast as they can, against a
sidecar whose admission gates shed what it cannot serve. Reported: p50/p99 of the assemblies that were
served, p99 of a cheap call (GetSession) made meanwhile, served and shed calls per second. Without gates
(``--admission-limits ""``) a review measured AssembleContext p50 700 ms / p99 2.7 s here.

**Embedding work.** What one caller's embedding work can cost everyone else:

- one ``Embed`` call of 250 texts of 63 KB (the call that held the model for up to a minute): refused
  at once by its cost limit, or answered, within a second;
- four callers flooding ``Embed`` (128 texts of 2 KB each, as fast as they are served) while another user
  searches (a query embedding each), health is probed and another session appends: the search, the probe
  and the append keep their figures.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import memlane
from memlane import Message, Role
from memlane.v1 import memory_pb2

from .runner import Latency, Report, percentiles

# Overload.

CLIENTS = 32
TEXT = "Could you move my coffee order to Friday and keep the oat milk? "


async def _overload_flood(target: str, user: str, seconds: float) -> dict[str, Any]:
    served: list[float] = []
    cheap: list[float] = []
    shed = failed = 0
    deadline = time.perf_counter() + seconds
    async with memlane.AsyncClient(target, timeout=60, retry=memlane.NO_RETRY) as c:
        sids = [
            (await c.create_session(user_id=user, agent_id="bench-agent")).session.session_id
            for _ in range(CLIENTS)
        ]

        async def client(sid: str, k: int) -> None:
            nonlocal shed, failed
            i = 0
            while time.perf_counter() < deadline:
                i += 1
                try:
                    await c.append_messages(
                        session_id=sid, messages=[Message(role=Role.ROLE_USER, content=TEXT)]
                    )
                    t0 = time.perf_counter()
                    async for _ in c.assemble_context(session_id=sid, user_input=f"coffee {k}-{i}?"):
                        pass
                    served.append(time.perf_counter() - t0)
                except memlane.ResourceExhaustedError:
                    shed += 1
                    await asyncio.sleep(0.02)  # a real client would wait the hint; keep the pressure on
                except memlane.MemlaneError:
                    failed += 1

        async def prober() -> None:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                await c.get_session(session_id=sids[0])
                cheap.append(time.perf_counter() - t0)
                await asyncio.sleep(0.05)

        t0 = time.perf_counter()
        await asyncio.gather(*(client(s, k) for k, s in enumerate(sids)), prober())
        elapsed = time.perf_counter() - t0
    return {"served": served, "cheap": cheap, "shed": shed, "failed": failed, "elapsed": elapsed}


def overload(
    report: Report, echo: Callable[[int], Latency], target: str, user: str, seconds: float, *, label: str = ""
) -> None:
    """The load rows: served iterations per second (append + assemble), assembly p50/p99, a cheap call's
    latency meanwhile, and how many calls the gates shed. ``label`` names a sidecar other than the
    default one."""
    out = asyncio.run(_overload_flood(target, user, seconds))
    base = echo(100)
    served = out["served"] or [float("nan")]
    p50, p99 = percentiles(served)
    name = f"append + assemble with LTM, {CLIENTS} clients" + (f", {label}" if label else "")
    report.latency(
        Latency(f"AssembleContext under load ({name})", p50, p99, len(out["served"])), base, p99_ms=150
    )
    report.rate(f"load: {name}, iterations served", len(out["served"]) / out["elapsed"], at_least=200)
    suffix = f" ({label})" if label else ""
    if out["cheap"]:
        p50, p99 = percentiles(out["cheap"])
        report.latency(Latency(f"GetSession during that load{suffix}", p50, p99, len(out["cheap"])), base)
    report.rate(f"load: AssembleContext shed by admission{suffix}", out["shed"] / out["elapsed"])
    report.rate(f"load: calls failed otherwise{suffix}", out["failed"] / out["elapsed"])


# Embedding work.

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


async def _embed_flood(target: str, searcher: str, seconds: float) -> dict[str, list[float] | int]:
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
    out = asyncio.run(_embed_flood(target, searcher, seconds))
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
