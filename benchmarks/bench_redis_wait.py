"""The cost of ``redis_wait_replicas``: AppendMessages latency through a real sidecar on a Redis Cluster
(3 masters + 3 replicas on loopback), without and with WAIT for one replica.

    scripts/redis-cluster start /tmp/rc 7000
    python benchmarks/bench_redis_wait.py --redis-url redis+cluster://127.0.0.1:7001 [-n 500]
    scripts/redis-cluster stop /tmp/rc
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid

import memlane
from memlane import Message, Role
from memlane_server.background import SidecarThread
from memlane_server.config import build_settings


def measure(url: str, n: int, replicas: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = build_settings(
            flags={
                "listen": "127.0.0.1:0",
                "admin_listen": "",
                "redis_url": url,
                "key_prefix": f"bw{uuid.uuid4().hex[:8]}",
                "data_dir": tmp,
                "ltm_enabled": False,
                "redis_wait_replicas": replicas,
            },
            env={},
        )
        with SidecarThread(settings) as srv, memlane.Client(srv.target, timeout=10) as c:
            sid = c.create_session(user_id="bench-wait").session.session_id
            samples = []
            for i in range(n + 50):
                t0 = time.perf_counter()
                c.append_messages(
                    session_id=sid, messages=[Message(role=Role.ROLE_USER, content=f"turn {i}")]
                )
                if i >= 50:  # warm-up
                    samples.append(time.perf_counter() - t0)
    samples.sort()
    return statistics.median(samples) * 1000, samples[int(0.99 * (len(samples) - 1))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("-n", type=int, default=500)
    args = ap.parse_args()
    for replicas in (0, 1, 0, 1):  # interleaved: the machine's load drifts
        p50, p99 = measure(args.redis_url, args.n, replicas)
        print(f"AppendMessages, redis_wait_replicas={replicas}: p50 {p50:.2f} ms, p99 {p99:.2f} ms")


if __name__ == "__main__":
    main()
