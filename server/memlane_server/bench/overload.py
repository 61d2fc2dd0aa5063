"""The load rows: 32 clients each appending then assembling (with LTM) as fast as they can, against a
sidecar whose admission gates shed what it cannot serve. Reported: p50/p99 of the assemblies that were
served, p99 of a cheap call (GetSession) made meanwhile, served and shed calls per second.

Without gates (``--admission-limits ""``) a review measured AssembleContext p50 700 ms / p99 2.7 s here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import memlane
from memlane import Message, Role

from .report import Report
from .runner import Latency, percentiles

CLIENTS = 32
TEXT = "Could you move my coffee order to Friday and keep the oat milk? "


async def _flood(target: str, user: str, seconds: float) -> dict[str, Any]:
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
    out = asyncio.run(_flood(target, user, seconds))
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
