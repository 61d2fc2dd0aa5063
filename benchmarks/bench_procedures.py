"""What procedural memory and memory versions cost, against a real Redis and real in-process sidecars.

    python benchmarks/bench_procedures.py [--redis-url redis://127.0.0.1:6379/0] [-n 200]

1. AssembleContext p50 for an agent with 5 active procedures, as a ratio to the same assembly for an
   agent with none (same sidecar, same session shape, rounds interleaved; best of 5 rounds).
2. CreateMemory p50 with every change journaled as a version, as a ratio to a sidecar keeping none
   (``ltm_versions_max_per_user=0``).
Every key the sidecars wrote is deleted at the end.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from itertools import count
from typing import Any

import redis

import memlane
from memlane import Message, Role
from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import procedure_pb2 as ppb
from memlane_server.background import SidecarThread
from memlane_server.config import build_settings


def _server(url: str, **overrides: Any) -> SidecarThread:
    values = {
        "listen": "127.0.0.1:0",
        "admin_listen": "",
        "redis_url": url,
        "key_prefix": f"bench{uuid.uuid4().hex[:8]}",
        "data_dir": tempfile.mkdtemp(),
        "procedure_approval": "auto",
        **overrides,
    }
    return SidecarThread(build_settings(flags=values, env={})).start()


def _p50_ms(fn: Callable[[], object], n: int) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def _assembly(c: memlane.Client, n: int) -> tuple[float, float]:
    for agent, procedures in (("plain", 0), ("proc", 5)):
        c.create_session(session_id=f"s-{agent}", user_id="u", agent_id=agent)
        turns = [Message(role=Role.ROLE_USER, content=f"turn {i} about the order") for i in range(10)]
        c.append_messages(session_id=f"s-{agent}", messages=turns)
        for i in range(procedures):
            c.propose_procedure(
                owner=ppb.ProcedureOwner(agent_id=agent),
                procedure_id=f"p{i}",
                kind=ppb.PROCEDURE_KIND_ROUTINE,
                content=f"Step {i}: check the order number and the delivery date.",
            )
    rounds: dict[str, list[float]] = {"plain": [], "proc": []}
    for _ in range(5):  # interleaved: the machine is shared and noisy
        for agent, series in rounds.items():
            series.append(_p50_ms(lambda a=agent: list(c.assemble_context(session_id=f"s-{a}")), n))
    return min(rounds["plain"]), min(rounds["proc"])


def _create(kept: memlane.Client, not_kept: memlane.Client, n: int) -> tuple[float, float]:
    """Call by call, alternating between the two sidecars, so both see the same machine load."""
    k = count()
    times: dict[int, list[float]] = {0: [], 1: []}
    for i in range(2 * (n + 10)):
        c = (kept, not_kept)[i % 2]
        start = time.perf_counter()
        c.create_memory(
            caller=mpb.Caller(user_id="w"),
            kind=mpb.MEMORY_KIND_FACT,
            content=f"The user owns item number {next(k)} in the box.",
        )
        if i >= 20:
            times[i % 2].append(time.perf_counter() - start)
    return statistics.median(times[0]) * 1000, statistics.median(times[1]) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("-n", type=int, default=200)
    args = parser.parse_args()
    keep, off = _server(args.redis_url), _server(args.redis_url, ltm_versions_max_per_user=0)
    try:
        with memlane.Client(keep.target, timeout=30) as c, memlane.Client(off.target, timeout=30) as o:
            none, five = _assembly(c, args.n)
            kept, not_kept = _create(c, o, args.n)
        print(f"AssembleContext p50: 0 procedures {none:.2f} ms, 5 active {five:.2f} ms, x{five / none:.3f}")
        print(
            f"CreateMemory p50: versions kept {kept:.2f} ms, none {not_kept:.2f} ms, x{kept / not_kept:.3f}"
        )
    finally:
        r = redis.Redis.from_url(args.redis_url)
        for server in (keep, off):
            server.stop()
            for key in r.scan_iter(match=f"{server.settings.redis.key_prefix}:*", count=1000):
                r.delete(key)


if __name__ == "__main__":
    main()
