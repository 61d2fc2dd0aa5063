"""LangGraph checkpoints through memlane vs langgraph-checkpoint-redis, same Redis, same run.

    python benchmarks/bench_langgraph.py [--redis-url redis://127.0.0.1:6379/0] [-n 300]

Measures ``put`` (a step that changes the messages channel of a 20-message conversation) and
``get_tuple`` (the latest checkpoint of the thread, the read every graph step starts with), p50 and p99,
each as a ratio to a bare gRPC echo measured in the same run (memlane_server.bench), the series
interleaved call by call.
langgraph-checkpoint-redis needs the RedisJSON and RediSearch modules; without them it is reported as
not measurable and memlane's figures stand alone.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import grpc
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from memlane.integrations.langgraph import MemlaneSaver
from memlane_server.bench.runner import Latency, echo_call, percentiles, start_echo
from memlane_server.bench.suite import Sidecar


def _messages(n: int) -> list[Any]:
    return [
        (HumanMessage if i % 2 == 0 else AIMessage)(content=f"turn {i}: " + "words " * 30, id=f"m{i}")
        for i in range(n)
    ]


def _calls(saver: BaseCheckpointSaver[Any]) -> tuple[Callable[[], object], Callable[[], object]]:
    """put (a step that rewrites the messages channel) and get_tuple (the latest checkpoint) of a thread."""
    thread = str(uuid.uuid4())
    msgs = _messages(20)
    state: dict[str, Any] = {
        "config": {"configurable": {"thread_id": thread, "checkpoint_ns": ""}},
        "v": None,
    }

    def put() -> None:
        cp = empty_checkpoint()
        cp["id"] = str(uuid6(clock_seq=-1))
        v = saver.get_next_version(state["v"], None)
        state["v"] = v
        cp["channel_values"] = {"messages": msgs}
        cp["channel_versions"] = {"messages": v}
        state["config"] = saver.put(state["config"], cp, {"source": "loop", "step": 1}, {"messages": v})

    def get() -> None:
        assert saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}}) is not None

    return put, get


def _interleaved(calls: dict[str, Callable[[], object]], n: int, warmup: int = 30) -> list[Latency]:
    """Runs the calls round-robin, so every series sees the same machine load (a loaded 2-core box
    drifts by several x within a minute; series measured one after the other are not comparable)."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for i in range(warmup + n):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            if i >= warmup:
                samples[name].append(time.perf_counter() - t0)
    out = []
    for name, xs in samples.items():
        p50, p99 = percentiles(xs)
        out.append(Latency(name, p50, p99, n))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("-n", type=int, default=300)
    args = ap.parse_args()

    echo_proc, echo_target = start_echo()
    channel = grpc.insecure_channel(echo_target)
    calls: dict[str, Callable[[], object]] = {"bare grpc echo (baseline)": echo_call(channel, b"x" * 2048)}
    redis_note = ""
    redis_saver: Any = None
    try:
        from langgraph.checkpoint.redis import RedisSaver  # noqa: PLC0415

        redis_saver = RedisSaver(redis_url=args.redis_url)
        redis_saver.setup()
        put, get = _calls(redis_saver)
        calls |= {"langgraph-checkpoint-redis put": put, "langgraph-checkpoint-redis get_tuple": get}
    except Exception as exc:
        redis_note = (
            f"langgraph-checkpoint-redis: not measurable here ({type(exc).__name__}: {str(exc)[:160]})"
        )
    try:
        with tempfile.TemporaryDirectory() as d, Sidecar(d, args.redis_url, "--ltm-enabled", "false") as sc:
            saver = MemlaneSaver(sc.target, user_id="bench")
            saver.mirror_messages = False  # the checkpoint alone, like the Redis saver
            put, get = _calls(saver)
            rows = _interleaved({**calls, "memlane put": put, "memlane get_tuple": get}, args.n)
            saver.close()
    finally:
        channel.close()
        echo_proc.stop()
    echo = rows[0]
    print("| measure | p50 ms | p99 ms | p50 / echo |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r.name} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.p50_ms / echo.p50_ms:.1f}x |")
    if redis_note:
        print(redis_note)


if __name__ == "__main__":
    main()
