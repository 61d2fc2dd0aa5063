"""Many writers, one table: session-end promotion by 1, 2 and 4 ``memlane worker`` processes into one LTM
table on S3 (scripts/s3-server, moto on loopback), behind one thin sidecar (``pipeline_enabled: false``).

Not a test: prints, per worker count, sessions ended per second, memories written per second, LanceDB
commits (conditional PUTs of a manifest) and how many a concurrent commit refused (412), the workers'
commit retries, and every figure's ratio to the 1-worker run of the same invocation. docs/reliability.md
("Many writers, one table") has the figures and the arithmetic for 50 pods.

    PYTHONPATH=server:client_py python benchmarks/bench_workers_s3.py [--workers 1,2,4] [--sessions 24]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from bench_ltm_sharing import AWS, BUCKET, ROOT, drop_keys, s3_server

import memlane
from memlane import Message, PromotionState, Role

TURNS = 40
RETRY = "retrying on the latest version"


def _flags(args: argparse.Namespace, prefix: str, run: Path, name: str) -> list[str]:
    return [
        "--redis-url", args.redis_url, "--key-prefix", prefix, "--data-dir", str(run / name),
        "--ltm-uri", f"s3://{BUCKET}/{prefix}/ltm", "--archive-uri", f"s3://{BUCKET}/{prefix}/archive",
        "--admin-listen", "", "--log-format", "text", "--log-level", "INFO",
        "--learn-every-turns", "0", "--learn-idle-seconds", "0", "--keyspace-events-configure", "false",
    ]  # fmt: skip


def _spawn(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)


def _consumers(r: redis.Redis, prefix: str) -> int:
    try:
        return len(r.xinfo_consumers(f"{prefix}:queue:session-end", "session-end"))
    except redis.ResponseError:  # the group is made by the first worker that starts
        return 0


def run(workers: int, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    prefix = f"bw{uuid.uuid4().hex[:8]}"
    server, endpoint = s3_server(run_dir / prefix, racy=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMLANE_")}
    env.update(AWS, AWS_ENDPOINT_URL=endpoint, PYTHONPATH=f"{ROOT / 'client_py'}:{ROOT / 'server'}")
    sock = run_dir / f"{prefix}.sock"
    serve = [sys.executable, "-m", "memlane_server.cli", "serve", "--listen", f"unix:{sock}"]
    procs = [_spawn([*serve, *_flags(args, prefix, run_dir, "thin"), "--pipeline-enabled", "false"],
                    run_dir / f"{prefix}-thin.log", env)]  # fmt: skip
    r = redis.Redis.from_url(args.redis_url)
    out: dict[str, Any] = {"workers": workers}
    try:
        with memlane.Client(f"unix:{sock}", timeout=60) as c:
            deadline = time.monotonic() + 120
            while True:
                try:
                    c.list_sessions(user_id="probe", page_size=1)
                    break
                except memlane.MemlaneError:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the thin sidecar did not start") from None
                    time.sleep(0.2)
            sids = []
            for k in range(args.sessions):
                sid = c.create_session(user_id=f"u{k % 6}", agent_id="a").session.session_id
                c.append_messages(
                    session_id=sid,
                    messages=[
                        Message(
                            role=Role.ROLE_USER if j % 2 == 0 else Role.ROLE_ASSISTANT,
                            content=f"Turn {j}: I moved to Porto in {2000 + j}; my ticket is T-{k}-{j}.",
                        )
                        for j in range(TURNS)
                    ],
                )
                sids.append(sid)
            worker = [sys.executable, "-m", "memlane_server.cli", "worker"]
            for i in range(workers):
                log = run_dir / f"{prefix}-w{i}.log"
                procs.append(_spawn([*worker, *_flags(args, prefix, run_dir, f"w{i}")], log, env))
            # Timed from when every worker reads the stream (start-up, the model's load, is not measured).
            while _consumers(r, prefix) < workers:
                time.sleep(0.1)
            t0 = time.perf_counter()
            for sid in sids:
                c.close_session(session_id=sid)
            archived = PromotionState.PROMOTION_STATE_ARCHIVED
            while True:
                done = sum(
                    int(r.hget(f"{prefix}:{{{s}}}:doc", "promotion_state") or 0) == archived for s in sids
                )
                if done == len(sids) or time.perf_counter() - t0 > args.timeout:
                    break
                time.sleep(0.1)
            out["elapsed"] = time.perf_counter() - t0
            out["ended"] = done
            out["memories"] = sum(int(r.scard(f"{prefix}:{{{s}}}:promoted") or 0) for s in sids)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(120)
        server.send_signal(signal.SIGTERM)
        drop_keys(args.redis_url, prefix)
        lines = [ln for ln in server.communicate(timeout=30)[0].splitlines() if ln.startswith("STATS ")]
        r.close()
    out["s3"] = json.loads(lines[-1][6:]) if lines else {}
    logs = "".join((run_dir / f"{prefix}-w{i}.log").read_text(errors="replace") for i in range(workers))
    out["retries"] = len(re.findall(re.escape(RETRY), logs))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated (first: baseline)")
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="memlane-bench-workers-"))
    try:
        results = [run(int(n), args, tmp) for n in args.workers.split(",")]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = results[0]
    print(f"{args.sessions} sessions of {TURNS} turns closed at once, promoted into one s3:// LTM table")
    for res in results:
        s3 = res["s3"]
        rate = res["ended"] / res["elapsed"]
        mem_rate = res["memories"] / res["elapsed"]
        commits = s3.get("conditional_puts") or 0
        print(
            f"  {res['workers']} worker(s): {res['ended']}/{args.sessions} ended in {res['elapsed']:.1f} s,"
            f" {rate:.2f} sessions/s ({rate / (base['ended'] / base['elapsed']):.2f}x of {base['workers']}),"
            f" {mem_rate:.1f} memories/s, commits {commits}, refused (412) {s3.get('refused_412')},"
            f" worker retries {res['retries']}, memories per commit {res['memories'] / max(commits, 1):.1f}"
        )


if __name__ == "__main__":
    main()
