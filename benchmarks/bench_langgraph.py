"""LangGraph checkpoints through memlane vs langgraph-checkpoint-redis, same Redis, same run.

    python benchmarks/bench_langgraph.py [--redis-url redis://127.0.0.1:6379/0] [-n 300]

Measures ``put`` (a step that changes the messages channel of a 20-message conversation) and
``get_tuple`` (the latest checkpoint of the thread, the read every graph step starts with), p50 and p99,
each as a ratio to a bare gRPC echo measured in the same run (memlane_server.bench).
langgraph-checkpoint-redis needs the RedisJSON and RediSearch modules; without them it is reported as
not measurable and memlane's figures stand alone.
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from typing import Any

import grpc
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from memlane.integrations.langgraph import MemlaneSaver
from memlane_server.bench.runner import Latency, echo_call, measure, start_echo
from memlane_server.bench.suite import Sidecar


def _messages(n: int) -> list[Any]:
    return [
        (HumanMessage if i % 2 == 0 else AIMessage)(content=f"turn {i}: " + "words " * 30, id=f"m{i}")
        for i in range(n)
    ]


def _bench(saver: BaseCheckpointSaver[Any], name: str, n: int) -> list[Latency]:
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

    return [measure(f"{name} put", put, n, warmup=20), measure(f"{name} get_tuple", get, n, warmup=20)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("-n", type=int, default=300)
    args = ap.parse_args()

    echo_proc, echo_target = start_echo()
    channel = grpc.insecure_channel(echo_target)
    try:
        echo = measure("bare grpc echo (baseline)", echo_call(channel, b"x" * 2048), args.n)
    finally:
        channel.close()
        echo_proc.stop()
    rows = [echo]
    with tempfile.TemporaryDirectory() as d, Sidecar(d, args.redis_url, "--ltm-enabled", "false") as sidecar:
        saver = MemlaneSaver(sidecar.target, user_id="bench")
        saver.mirror_messages = False  # the checkpoint alone, like the Redis saver
        rows += _bench(saver, "memlane", args.n)
        saver.close()
    redis_note = ""
    try:
        from langgraph.checkpoint.redis import RedisSaver  # noqa: PLC0415

        with RedisSaver.from_conn_string(args.redis_url) as rs:
            rs.setup()
            rows += _bench(rs, "langgraph-checkpoint-redis", args.n)
    except Exception as exc:
        redis_note = (
            f"langgraph-checkpoint-redis: not measurable here ({type(exc).__name__}: {str(exc)[:160]})"
        )
    print("| measure | p50 ms | p99 ms | p50 / echo |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r.name} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.p50_ms / echo.p50_ms:.1f}x |")
    if redis_note:
        print(redis_note)


if __name__ == "__main__":
    main()
