"""Many writers, one table: session-end promotion by 1, 2 and 4 ``memlane worker`` processes into one LTM
table on S3 (scripts/s3-server, moto on loopback, optionally answering each request N ms late as a real
store does), behind one thin sidecar (``pipeline_enabled: false``).

Not a test: prints, per worker count and store latency, sessions ended per second, memories written per
second, LanceDB commits (conditional PUTs of a manifest) per session end and the share a concurrent commit
refused (412), the workers' commit retries, p50/p99 of a session's end (its close to its archive), the
table's fragments after the run, and the throughput's ratio to the first run of the same invocation.
docs/reliability.md ("Many writers, one table") has the figures and the arithmetic for 50 pods.

    PYTHONPATH=server:client_py python benchmarks/bench_workers_s3.py [--workers 1,2,4] [--latency-ms 0,30]

Runs on every Redis version: a worker is ready when it logs that it runs (not when ``XINFO CONSUMERS``
lists it, which Redis before 7.2 does only once a job was delivered). Every wait has a deadline, and every
process and key a run made is removed on any exit (a timeout, an error, SIGINT or SIGTERM included).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lancedb
import redis
from bench_ltm_sharing import AWS, BUCKET, ROOT, drop_keys, s3_server

import memlane
from memlane import Message, PromotionState, Role

TURNS = 40
RETRY = "retrying on the latest version"
READY = "memlane worker running"  # the line a worker logs once its job consumer runs (cli/start.py)
START_DEADLINE_S = 180.0  # a process's start: the model's load on a busy 2-core machine


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


def _stop(procs: list[subprocess.Popen[bytes]], grace_s: float = 30.0) -> None:
    """SIGTERM to all, then SIGKILL to whatever has not exited within the grace (a stuck process must
    not outlive the benchmark)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def _wait(what: str, done: Any, deadline_s: float, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + deadline_s
    while not done():
        if any(p.poll() is not None for p in procs):
            raise RuntimeError(f"a process exited while waiting for {what}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up waiting for {what} after {deadline_s:.0f} s")
        time.sleep(0.1)


def _fragments(prefix: str, endpoint: str) -> int | None:
    """Fragments of the LTM table after the run (how far compaction kept up), or None if unreadable."""
    options = {
        "aws_endpoint": endpoint,
        "aws_access_key_id": AWS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": AWS["AWS_SECRET_ACCESS_KEY"],
        "aws_region": AWS["AWS_REGION"],
        "allow_http": "true",
    }
    try:
        db = lancedb.connect(f"s3://{BUCKET}/{prefix}/ltm", storage_options=options)
        stats = db.open_table("memories").stats()
        return int(stats["fragment_stats"]["num_fragments"])
    except Exception:  # a figure, not a verdict: an unreadable table prints as "?"
        return None


@contextlib.contextmanager
def _terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM (a CI timeout) unwinds like Ctrl-C, so every ``finally`` below removes what it made."""

    def interrupt(*_: Any) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def run(workers: int, latency_ms: float, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    prefix = f"bw{uuid.uuid4().hex[:8]}"
    server, endpoint = s3_server(run_dir / prefix, racy=False, latency_ms=latency_ms)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMLANE_")}
    env.update(AWS, AWS_ENDPOINT_URL=endpoint, PYTHONPATH=f"{ROOT / 'client_py'}:{ROOT / 'server'}")
    sock = run_dir / f"{prefix}.sock"
    serve = [sys.executable, "-m", "memlane_server.cli", "serve", "--listen", f"unix:{sock}"]
    procs: list[subprocess.Popen[bytes]] = []
    r = redis.Redis.from_url(args.redis_url)
    out: dict[str, Any] = {"workers": workers, "latency_ms": latency_ms, "ended": 0, "memories": 0}
    logs = [run_dir / f"{prefix}-w{i}.log" for i in range(workers)]
    try:
        procs.append(
            _spawn([*serve, *_flags(args, prefix, run_dir, "thin"), "--pipeline-enabled", "false"],
                   run_dir / f"{prefix}-thin.log", env)
        )  # fmt: skip
        with memlane.Client(f"unix:{sock}", timeout=60) as c:

            def answers() -> bool:
                try:
                    c.list_sessions(user_id="probe", page_size=1)
                    return True
                except memlane.MemlaneError:
                    return False

            _wait("the thin sidecar", answers, START_DEADLINE_S, procs)
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
                procs.append(_spawn([*worker, *_flags(args, prefix, run_dir, f"w{i}")], logs[i], env))
            # Timed from when every worker runs its consumer (start-up, the model's load, is not measured).
            _wait(
                f"{workers} worker(s) to start",
                lambda: (
                    all(READY in log.read_text(errors="replace") for log in logs if log.exists())
                    and all(log.exists() for log in logs)
                ),
                START_DEADLINE_S,
                procs,
            )
            closed: dict[str, float] = {}
            t0 = time.perf_counter()
            for sid in sids:
                c.close_session(session_id=sid)
                closed[sid] = time.perf_counter()
            archived = PromotionState.PROMOTION_STATE_ARCHIVED
            ended: dict[str, float] = {}
            while len(ended) < len(sids) and time.perf_counter() - t0 <= args.timeout:
                for s in sids:
                    if (
                        s not in ended
                        and int(r.hget(f"{prefix}:{{{s}}}:doc", "promotion_state") or 0) == archived
                    ):
                        ended[s] = time.perf_counter()
                time.sleep(0.1)
            out["elapsed"] = (max(ended.values()) if ended else time.perf_counter()) - t0
            out["ended"] = len(ended)
            out["end_s"] = sorted(ended[s] - closed[s] for s in ended)
            out["memories"] = sum(int(r.scard(f"{prefix}:{{{s}}}:promoted") or 0) for s in sids)
        out["fragments"] = _fragments(prefix, endpoint)
    finally:
        try:
            _stop(procs)
        finally:
            drop_keys(args.redis_url, prefix)
            r.close()
            server.send_signal(signal.SIGTERM)
            try:
                stdout = server.communicate(timeout=30)[0]
            except subprocess.TimeoutExpired:
                server.kill()
                stdout = server.communicate(timeout=10)[0]
    lines = [ln for ln in stdout.splitlines() if ln.startswith("STATS ")]
    out["s3"] = json.loads(lines[-1][6:]) if lines else {}
    text = "".join(log.read_text(errors="replace") for log in logs if log.exists())
    out["retries"] = len(re.findall(re.escape(RETRY), text))
    return out


def _quantile(values: list[float], q: float) -> float:
    return values[min(int(q * len(values)), len(values) - 1)] if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated (first: baseline)")
    parser.add_argument("--latency-ms", default="0", help="S3 request latencies, comma-separated")
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on one run's session ends")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="memlane-bench-workers-"))
    grid = itertools.product(
        [float(x) for x in args.latency_ms.split(",")], [int(n) for n in args.workers.split(",")]
    )
    try:
        with _terminated_as_interrupt():
            results = [run(n, ms, args, tmp) for ms, n in grid]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base = results[0]
    base_rate = base["ended"] / base["elapsed"]
    print(f"{args.sessions} sessions of {TURNS} turns closed at once, promoted into one s3:// LTM table")
    for res in results:
        s3 = res["s3"]
        rate = res["ended"] / res["elapsed"]
        commits = s3.get("conditional_puts") or 0
        refused = s3.get("refused_412") or 0
        print(
            f"  {res['workers']} worker(s), S3 +{res['latency_ms']:.0f} ms:"
            f" {res['ended']}/{args.sessions} ended in {res['elapsed']:.1f} s, {rate:.2f} sessions/s"
            f" ({rate / base_rate:.2f}x of the first run),"
            f" {res['memories'] / res['elapsed']:.1f} memories/s, commits {commits}"
            f" ({commits / max(res['ended'], 1):.2f} a session end), refused (412) {refused}"
            f" ({100 * refused / max(commits, 1):.0f}%), worker retries {res['retries']},"
            f" session end p50 {_quantile(res['end_s'], 0.5):.1f} s"
            f" p99 {_quantile(res['end_s'], 0.99):.1f} s,"
            f" fragments {res['fragments'] if res['fragments'] is not None else '?'}"
        )


if __name__ == "__main__":
    main()
