"""Session-end latency and pipeline throughput, against a real Redis and a real in-process sidecar.

    /work/venv/bin/python benchmarks/bench_lifecycle.py [--redis-url redis://127.0.0.1:6379/0]

1. TTL expiry -> session end complete (ARCHIVED), p50/p95 over 100 sessions with a 1 s TTL.
   Baseline in the same run: when a bare subscriber hears Redis's own expiry event for the same keys
   (Redis evicts lazily, ~tens of ms late at ``hz 10``), so the ratio shows what memlane adds.
2. Pipeline throughput for 50-turn sessions (summarize + promote into LanceDB + Parquet archive),
   sessions/s with ``pipeline_concurrency`` workers. Baseline: the same sessions with promotion off
   (summary + archive only).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import uuid
from typing import Any

import redis

import memlane
from memlane import Message, Role
from memlane_server.background import SidecarThread
from memlane_server.config import build_settings

TURNS = [
    "I live in Pune and I prefer metric units.",
    "Noted, metric it is.",
    "Please always answer in British English.",
    "Understood.",
    "We decided to go with the annual plan; the budget must stay under $400.",
    "Great, the annual plan is confirmed.",
]


def start(redis_url: str, prefix: str, **extra: Any) -> SidecarThread:
    values: dict[str, Any] = {
        "listen": "127.0.0.1:0",
        "admin_listen": "",
        "redis_url": redis_url,
        "key_prefix": prefix,
        "data_dir": tempfile.mkdtemp(prefix="memlane-bench-"),
        "log_level": "WARNING",
    }
    values.update(extra)
    return SidecarThread(build_settings(flags=values, env={})).start()


def cleanup(r: redis.Redis, prefix: str) -> None:
    keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
    for i in range(0, len(keys), 500):
        r.delete(*keys[i : i + 500])


def archived_at(r: redis.Redis, prefix: str) -> dict[str, int]:
    return {f[b"s"].decode(): int(f[b"at"]) for _, f in r.xrange(f"{prefix}:events") if f[b"t"] == b"5"}


def bench_expiry(redis_url: str, n: int) -> tuple[list[float], list[float]]:
    prefix = f"bx{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(redis_url)
    heard: dict[str, int] = {}
    stop = threading.Event()

    def listen() -> None:  # the baseline: Redis's own expiry event, heard by a bare subscriber
        p = r.pubsub()
        p.subscribe("__keyevent@0__:expired")
        while not stop.is_set():
            msg = p.get_message(ignore_subscribe_messages=True, timeout=0.2)
            if msg and msg["data"].startswith(f"{prefix}:".encode()):
                heard[msg["data"].decode().split("{")[1].split("}")[0]] = time.time_ns() // 1_000_000
        p.close()

    t = threading.Thread(target=listen)
    t.start()
    srv = start(redis_url, prefix, ltm_enabled="false")
    try:
        with memlane.Client(srv.target) as c:
            sids = []
            for i in range(n):
                sid = c.create_session(user_id=f"u{i % 10}", ttl_seconds=1).session.session_id
                c.append_messages(
                    session_id=sid, messages=[Message(role=Role.ROLE_USER, content=TURNS[i % 6])]
                )
                sids.append(sid)
            deadline = time.monotonic() + 30
            while len(archived_at(r, prefix)) < n and time.monotonic() < deadline:
                time.sleep(0.1)
        done = archived_at(r, prefix)
        end_lat, base_lat = [], []
        for sid in sids:
            doc = r.hmget(f"{prefix}:{{{sid}}}:doc", ["last_activity_at_ms", "ttl_seconds"])
            ttl_end = int(doc[0]) + int(doc[1]) * 1000
            end_lat.append(done[sid] - ttl_end)
            if sid in heard:
                base_lat.append(heard[sid] - ttl_end)
        return end_lat, base_lat
    finally:
        stop.set()
        t.join()
        srv.stop()
        cleanup(r, prefix)


def bench_throughput(redis_url: str, n: int, turns: int, promote: bool) -> float:
    prefix = f"bt{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(redis_url)
    srv = start(redis_url, prefix, ltm_enabled=str(promote).lower(), pipeline_concurrency=2)
    try:
        with memlane.Client(srv.target, timeout=60) as c:
            sids = []
            for i in range(n):
                sid = c.create_session(user_id=f"tu{i % 10}", agent_id="bench").session.session_id
                msgs = [
                    Message(
                        role=Role.ROLE_USER if j % 2 == 0 else Role.ROLE_ASSISTANT,
                        content=f"{TURNS[j % 6]} (session {i}, turn {j})",
                    )
                    for j in range(turns)
                ]
                c.append_messages(session_id=sid, messages=msgs)
                sids.append(sid)
            t0 = time.perf_counter()
            for sid in sids:
                c.close_session(session_id=sid)
            while len(archived_at(r, prefix)) < n:
                time.sleep(0.02)
            return n / (time.perf_counter() - t0)
    finally:
        srv.stop()
        cleanup(r, prefix)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--sessions", type=int, default=100)
    ap.add_argument("--throughput-sessions", type=int, default=40)
    args = ap.parse_args()

    end_lat, base_lat = bench_expiry(args.redis_url, args.sessions)
    p50, base50 = statistics.median(end_lat), statistics.median(base_lat)
    p95 = statistics.quantiles(end_lat, n=20)[18]
    print(
        f"TTL expiry -> session end complete: p50 {p50:.0f} ms, p95 {p95:.0f} ms over {len(end_lat)} sessions"
    )
    print(
        f"  baseline, Redis expiry event heard by a bare subscriber: p50 {base50:.0f} ms "
        f"(memlane adds {p50 - base50:.0f} ms; ratio {p50 / max(base50, 1):.1f}x)"
    )
    full = bench_throughput(args.redis_url, args.throughput_sessions, 50, promote=True)
    bare = bench_throughput(args.redis_url, args.throughput_sessions, 50, promote=False)
    print(
        f"pipeline throughput, 50-turn sessions: {full:.1f} sessions/s with promotion "
        f"(baseline without promotion {bare:.1f} sessions/s; ratio {full / bare:.2f})"
    )


if __name__ == "__main__":
    main()
