"""The context call while learning runs: the peers harness's W3 (../shared/bench/peers/bench.py) against a
real ``memlane serve`` (worker process, model process), once with the defaults (learning during the
session) and once with learning at session end (``--learn-every-turns 0 --learn-idle-seconds 0``).

Not a test: prints, per configuration and session length (20 and 200 messages), p50/p99 of sequential
``AssembleContext`` calls made right after the append phases (while the worker still learns from them),
the serving process's CPU per call (``/proc/PID/stat`` before and after, the process alone and with its
worker and model processes), and the ratio of the defaults to learning-at-end. Both runs happen in one
invocation: on a shared machine only the ratios mean something.

    PYTHONPATH=server:client_py python benchmarks/bench_context_while_learning.py [--sessions 300]

The shape is the harness's, scaled by ``--sessions``: sessions of 50 alternating turns (W1's prefill),
one more user turn appended to each (W1's measured appends), a 200-message session (W2) and a
20-message one (W3), all of one user and agent; then ``--warmup`` and ``--calls`` context calls with the
same query and an 8192-token window, on the 20-message session and then on the 200-message one. Texts are
the harness's (same seed): word salad, so learning writes episodes and no fact.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

import memlane
from memlane import Message, Role

ROOT = Path(__file__).resolve().parent.parent
START_DEADLINE_S = 180.0
WINDOW, W1_PREFILL, W2_PREFILL = 20, 50, 200
CONTEXT_WINDOW = 8192
# bench.py's words, in its order.
_WORDS = [
    "memory", "session", "agent", "token", "context", "window", "user", "assistant", "prompt", "vector",
    "redis", "latency", "cache", "message", "history", "summary", "query", "tool", "call", "result",
    "plan", "step", "reply", "error", "retry", "model", "budget", "stream", "index",
]  # fmt: skip
_TICK = os.sysconf("SC_CLK_TCK")


def make_texts(n: int = 4096, seed: int = 42, chars: int = 200) -> list[str]:
    """bench.py's texts, byte for byte."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        s = f"[{i}]"
        while len(s) < chars:
            s += " " + rng.choice(_WORDS)
        out.append(s[:chars])
    return out


TEXTS = make_texts()


def message(k: int) -> Message:
    role = Role.ROLE_USER if k % 2 == 0 else Role.ROLE_ASSISTANT
    return Message(role=role, content=TEXTS[k % len(TEXTS)])


def cpu_s(pid: int, tree: bool) -> float:
    """user+system CPU seconds of ``pid`` (and its live descendants when ``tree``)."""
    children: dict[int, list[int]] = {}
    if tree:
        for d in os.listdir("/proc"):
            if d.isdigit():
                with contextlib.suppress(OSError, IndexError):
                    children.setdefault(int(_stat(int(d))[1]), []).append(int(d))
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = _stat(p)
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK
        todo += children.get(p, [])
    return total


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def pct(sorted_ms: list[float], p: float) -> float:
    i = min(len(sorted_ms) - 1, max(0, round(p / 100 * len(sorted_ms) + 0.5) - 1))
    return sorted_ms[i]


def measure(c: memlane.Client, pid: int, sid: str, args: argparse.Namespace) -> dict[str, float]:
    query = TEXTS[-1]

    def call() -> float:
        t = time.perf_counter()
        got = list(c.assemble_context(session_id=sid, user_input=query, context_window_tokens=CONTEXT_WINDOW))
        ms = (time.perf_counter() - t) * 1000
        assert any(r.blocks for r in got), "a context came back empty"
        return ms

    for _ in range(args.warmup):
        call()
    own, tree = cpu_s(pid, False), cpu_s(pid, True)
    lat = sorted(call() for _ in range(args.calls))
    own, tree = cpu_s(pid, False) - own, cpu_s(pid, True) - tree
    return {
        "p50": pct(lat, 50),
        "p99": pct(lat, 99),
        "cpu_ms": own * 1000 / args.calls,
        "tree_cpu_ms": tree * 1000 / args.calls,
    }


def _profile(pid: int, out: Path, args: argparse.Namespace) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the serving process (its threads, idle ones left out) while the calls run."""
    if not args.py_spy:
        return None
    cmd = [args.py_spy, "record", "-p", str(pid), "-o", str(out), "--format", "raw", "--rate", "100"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _hottest(stacks: Path, n: int = 25) -> str:
    """The functions on the most samples, on the stack and at its top, from py-spy's collapsed stacks."""
    seen: dict[str, int] = {}
    top: dict[str, int] = {}
    total = 0
    for line in stacks.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        total += int(count)
        for frame in set(frames.split(";")):
            seen[frame] = seen.get(frame, 0) + int(count)
        leaf = frames.split(";")[-1]
        top[leaf] = top.get(leaf, 0) + int(count)
    out = []
    for title, table in (("on the stack", seen), ("at the top", top)):
        rows = sorted(table.items(), key=lambda kv: -kv[1])[:n]
        out += [f"-- {title}", *(f"{c * 100 / max(total, 1):5.1f}% {f}" for f, c in rows)]
    return "\n".join(out)


def _settle(url: str, prefix: str, deadline_s: float = 900.0) -> None:
    """Waits until the worker has run every learn job queued so far (the stream's group has nothing
    undelivered or unacknowledged), then a few seconds more for the last commits to be seen."""
    r = redis.Redis.from_url(url)
    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline:
            groups = r.xinfo_groups(f"{prefix}:queue:session-end")
            if groups and all(g["pending"] == 0 and not g.get("lag") for g in groups):
                break
            time.sleep(1.0)
    finally:
        r.close()
    time.sleep(3.0)


def run(
    name: str, learn: bool, args: argparse.Namespace, run_dir: Path, *, settle: bool = False
) -> dict[str, dict[str, float]]:
    prefix = f"bcl{uuid.uuid4().hex[:8]}"
    sock = run_dir / f"{prefix}.sock"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMLANE_")}
    env["PYTHONPATH"] = f"{ROOT / 'client_py'}:{ROOT / 'server'}"
    cmd = [
        sys.executable, "-m", "memlane_server.cli", "serve", "--listen", f"unix:{sock}",
        "--redis-url", args.redis_url, "--key-prefix", prefix, "--data-dir", str(run_dir / prefix),
        "--admin-listen", "", "--session-ttl-seconds", "86400", "--keyspace-events-configure", "false",
    ]  # fmt: skip
    if not learn:
        cmd += ["--learn-every-turns", "0", "--learn-idle-seconds", "0"]
    log = (run_dir / f"{prefix}.log").open("ab")
    server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    out: dict[str, dict[str, float]] = {}
    try:
        with memlane.Client(f"unix:{sock}", timeout=60) as c:
            deadline = time.monotonic() + START_DEADLINE_S
            while True:
                if server.poll() is not None:
                    raise RuntimeError(f"memlane serve exited (see {run_dir / prefix}.log)")
                try:
                    c.list_sessions(user_id="probe", page_size=1)
                    break
                except memlane.MemlaneError:
                    if time.monotonic() > deadline:
                        raise TimeoutError("memlane serve did not answer") from None
                    time.sleep(0.2)

            def prefill(sid: str, n: int) -> None:
                c.create_session(session_id=sid, user_id="bench-user", agent_id="bench-agent")
                msgs = [message(k) for k in range(n)]
                for i in range(0, n, 100):
                    c.append_messages(session_id=sid, messages=msgs[i : i + 100])

            w1 = [f"{prefix}-w1-{i}" for i in range(args.sessions)]
            for sid in w1:
                prefill(sid, W1_PREFILL)
            prefill(f"{prefix}-w2", W2_PREFILL)
            prefill(f"{prefix}-w3", WINDOW)
            for i, sid in enumerate(w1):  # W1's measured appends: one user turn each
                user = Message(role=Role.ROLE_USER, content=TEXTS[(W1_PREFILL + i) % len(TEXTS)])
                c.append_messages(session_id=sid, messages=[user])
            stacks = Path(args.stacks or run_dir / f"{name}.stacks")
            spy = _profile(server.pid, stacks, args) if name == args.profile else None
            if settle:
                _settle(args.redis_url, prefix)
            for label, sid in (("20", f"{prefix}-w3"), ("200", f"{prefix}-w2")):
                out[label] = measure(c, server.pid, sid, args)
                print(name, label, {k: round(v, 2) for k, v in out[label].items()}, flush=True)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(60)
                print(_hottest(stacks), flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
        log.close()
        r = redis.Redis.from_url(args.redis_url)
        keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
        for i in range(0, len(keys), 500):
            r.delete(*keys[i : i + 500])
        r.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--sessions", type=int, default=300, help="W1 sessions (the harness: 1100)")
    p.add_argument("--calls", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--py-spy", default="", help="py-spy to sample the serving process with")
    p.add_argument("--profile", default="defaults", help="the configuration py-spy samples")
    p.add_argument(
        "--settled", action="store_true", help="also the defaults after the learn jobs ran (memories held)"
    )
    p.add_argument("--stacks", default="", help="where py-spy's collapsed stacks go (kept)")
    p.add_argument(
        "--only", choices=("at-end", "defaults", "none"), help="one configuration (none: --settled alone)"
    )
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ctx-learn-") as tmp:
        runs: dict[str, Any] = {}
        for name, learn in (("at-end", False), ("defaults", True)):
            if args.only in (None, name):
                runs[name] = run(name, learn, args, Path(tmp))
        if args.settled:  # the defaults once more, measured after learning has finished
            runs["settled"] = run("settled", True, args, Path(tmp), settle=True)
        if args.only:
            return
    print(f"\n{'messages':>8} {'config':>9} {'p50 ms':>7} {'p99 ms':>7} {'cpu ms':>7} {'tree cpu':>8}")
    for label in ("20", "200"):
        for name in [n for n in ("at-end", "defaults", "settled") if n in runs]:
            f = runs[name][label]
            cpu = f"{f['cpu_ms']:7.2f} {f['tree_cpu_ms']:8.2f}"
            print(f"{label:>8} {name:>9} {f['p50']:7.2f} {f['p99']:7.2f} {cpu}")
        d, e = runs["defaults"][label], runs["at-end"][label]
        print(f"{label:>8} {'ratio':>9} {d['p50'] / e['p50']:7.2f} {d['p99'] / e['p99']:7.2f}")


if __name__ == "__main__":
    main()
