"""The overload row: 32 clients each appending then assembling (with LTM) as fast as they can, against a
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
    add: Callable[[Latency], None], throughput: dict[str, float], target: str, user: str, seconds: float
) -> None:
    """Adds the overload rows through ``add`` and the rates to ``throughput``."""
    out = asyncio.run(_flood(target, user, seconds))
    if out["served"]:
        p50, p99 = percentiles(out["served"])
        add(
            Latency(
                f"AssembleContext under overload ({CLIENTS} clients append+assemble, LTM)",
                p50,
                p99,
                len(out["served"]),
            )
        )
    if out["cheap"]:
        p50, p99 = percentiles(out["cheap"])
        add(Latency("GetSession during that overload", p50, p99, len(out["cheap"])))
    throughput["AssembleContext served under overload"] = len(out["served"]) / out["elapsed"]
    throughput["AssembleContext shed under overload"] = out["shed"] / out["elapsed"]
    throughput["calls failed otherwise under overload"] = out["failed"] / out["elapsed"]
