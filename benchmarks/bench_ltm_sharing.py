"""Several sidecars sharing one LTM table on S3: conflicts, retries, lost writes, erasure, throughput.

Not a test: prints figures (docs/reliability.md, "Object storage"). Starts scripts/s3-server (moto's S3
on loopback) and N real `memlane serve` processes on one Redis prefix and one `s3://` LTM table, each
compacting every second (`ltm_optimize_after_writes=2`) and pruning every 5 s. Writer threads create
memories through every sidecar at once, a reader searches all along, and victims are erased (ForgetUser)
mid-way through rotating sidecars. Then: every acknowledged memory must be in the table exactly once and
seen by every sidecar, no object in the bucket may hold a victim's marker, and no call may fail.
The same workload through one sidecar is the baseline of the throughput ratio.

    PYTHONPATH=server:client_py python benchmarks/bench_ltm_sharing.py [--sidecars 3] [--writes 30]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import boto3  # type: ignore[import-untyped]  # moto's dependency (dev extra); no stubs installed
import redis

import memlane
from memlane.v1 import memory_pb2 as mpb
from memlane_server.ltm import LanceMemoryStore

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "memlane"
AWS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}
USERS = [f"user{i}" for i in range(6)]
LOG_COUNTS = {
    "write retries (commit lost, run again on the latest version)": "retrying on the latest version",
    "stale reads re-read (version cleaned up by another's erasure)": "re-reading the latest",
    "compactions skipped (another sidecar held the table lock)": "another sidecar holds the table lock",
    "compactions that lost their commit (left to the next round)": "lost its commit",
    "maintenance rounds failed": "memory maintenance failed",
}


def s3_server(workdir: Path, racy: bool, latency_ms: float = 0.0) -> tuple[subprocess.Popen[str], str]:
    workdir.mkdir(parents=True)
    ready = workdir / "s3.url"
    args = [
        sys.executable,
        str(ROOT / "scripts" / "s3-server"),
        "--bucket",
        BUCKET,
        "--ready-file",
        str(ready),
        "--latency-ms",
        str(latency_ms),
    ]
    args += ["--no-write-lock"] if racy else []
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=(workdir / "s3.log").open("ab"), text=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError("scripts/s3-server did not start")
        time.sleep(0.05)
    return proc, ready.read_text()


def start_sidecar(run: Path, name: str, args: argparse.Namespace, prefix: str, env: dict[str, str]) -> Any:
    sock = run / f"{name}.sock"
    cmd = [
        sys.executable, "-m", "memlane_server.cli", "serve", "--listen", f"unix:{sock}", "--admin-listen", "",
        "--redis-url", args.redis_url, "--key-prefix", prefix, "--data-dir", str(run / name),
        "--ltm-uri", f"s3://{BUCKET}/{prefix}/ltm", "--archive-uri", f"s3://{BUCKET}/{prefix}/archive",
        "--ltm-optimize-interval-seconds", "1", "--ltm-optimize-after-writes", "2",
        "--ltm-prune-interval-seconds", "5", "--log-format", "text", "--log-level", "INFO",
    ]  # fmt: skip
    log = (run / f"{name}.log").open("ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 180
    with memlane.Client(f"unix:{sock}", timeout=2, retry=memlane.NO_RETRY) as c:
        while True:
            try:
                c.list_memories(caller=mpb.Caller(user_id="probe"), page_size=1)
                return proc, f"unix:{sock}"
            except memlane.MemlaneError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"sidecar {name} did not start; see {run / name}.log") from None
                time.sleep(0.2)


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: dict[str, set[str]] = collections.defaultdict(set)
        self.latency: list[float] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.searches = 0
        self.forget_s: list[float] = []

    def error(self, what: str, exc: memlane.MemlaneError) -> None:
        with self.lock:
            self.errors[f"{what}: {exc.code.name}"] += 1


def writer(target: str, k: int, n: int, tally: Tally) -> None:
    with memlane.Client(target, timeout=120) as c:
        for i in range(n):
            user = USERS[(k + i) % len(USERS)]
            t0 = time.perf_counter()
            try:
                made = c.create_memory(
                    caller=mpb.Caller(user_id=user),
                    kind=mpb.MEMORY_KIND_FACT,
                    content=f"Writer {k} fact {i}: the user likes topic {uuid.uuid4().hex[:8]}.",
                )
            except memlane.MemlaneError as exc:
                tally.error("create", exc)
                continue
            with tally.lock:
                tally.latency.append(time.perf_counter() - t0)
                tally.acked[user].add(made.memory.memory_id)


def reader(target: str, stop: threading.Event, tally: Tally) -> None:
    with memlane.Client(target, timeout=60) as c:
        while not stop.is_set():
            try:
                c.search_memories(caller=mpb.Caller(user_id=USERS[0]), query="topic likes", limit=10)
                with tally.lock:
                    tally.searches += 1
            except memlane.MemlaneError as exc:
                tally.error("search", exc)


def eraser(targets: list[str], victims: list[str], gap_s: float, tally: Tally) -> int:
    erased = 0
    for i, victim in enumerate(victims):
        time.sleep(gap_s)
        with memlane.Client(targets[i % len(targets)], timeout=300) as c:
            t0 = time.perf_counter()
            try:
                erased += c.forget_user(user_id=victim).erased["lancedb.items"]
            except memlane.MemlaneError as exc:
                tally.error("forget", exc)
            with tally.lock:
                tally.forget_s.append(time.perf_counter() - t0)
    return erased


def workload(targets: list[str], args: argparse.Namespace, tag: str) -> dict[str, Any]:
    tally = Tally()
    victims = [f"victim{i}-{tag}" for i in range(args.forget)]
    marks = {v: f"Marker{uuid.uuid4().hex[:10]}" for v in victims}
    for i, v in enumerate(victims):  # seeded through every sidecar
        with memlane.Client(targets[i % len(targets)], timeout=60) as c:
            for j in range(3):
                c.create_memory(
                    caller=mpb.Caller(user_id=v), kind=mpb.MEMORY_KIND_FACT, content=f"{marks[v]} {j}."
                )
    stop = threading.Event()
    total_writers = args.writers * len(targets)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(total_writers + 2) as pool:
        read = pool.submit(reader, targets[-1], stop, tally)
        erase = pool.submit(eraser, targets, victims, args.writes * 0.02, tally)
        writes = [
            pool.submit(writer, targets[k % len(targets)], k, args.writes, tally)
            for k in range(total_writers)
        ]
        for f in writes:
            f.result()
        elapsed = time.perf_counter() - t0
        erased = erase.result()
        stop.set()
        read.result()
    return {"tally": tally, "elapsed": elapsed, "erased": erased, "victims": victims, "marks": marks}


def converge(targets: list[str], tally: Tally, timeout: float = 30.0) -> dict[str, int]:
    """Acknowledged memories each sidecar does not list (after waiting out read consistency)."""
    deadline = time.monotonic() + timeout
    while True:
        missing: dict[str, int] = {}
        for t in targets:
            with memlane.Client(t, timeout=60) as c:
                n = 0
                for user in USERS:
                    page = c.list_memories(caller=mpb.Caller(user_id=user), page_size=500).memories
                    n += len(tally.acked[user] - {m.memory_id for m in page})
                missing[t] = n
        if not any(missing.values()) or time.monotonic() > deadline:
            return missing
        time.sleep(0.5)


async def table_rows(uri: str) -> collections.Counter[str]:
    store = await LanceMemoryStore.open(uri, 384)
    ids = (await store.fetch_columns(None, ["id"]))["id"].to_pylist()
    store.close()
    return collections.Counter(str(i) for i in ids)


def leftovers(endpoint: str, prefix: str, needles: list[bytes]) -> int:
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=AWS["AWS_REGION"],
                      aws_access_key_id="test", aws_secret_access_key="test")  # fmt: skip
    found = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for o in page.get("Contents", []):
            body = s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read()
            found += sum(1 for n in needles if n in body)
    return found


def drop_keys(url: str, prefix: str) -> None:
    r = redis.Redis.from_url(url)
    keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
    for i in range(0, len(keys), 500):
        r.delete(*keys[i : i + 500])
    r.close()


def run(n_sidecars: int, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """One workload on a fresh S3 server (its commit counts are this run's alone)."""
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    server, endpoint = s3_server(run_dir / prefix, args.racy_s3)
    os.environ.update(AWS, AWS_ENDPOINT_URL=endpoint)  # for this process's own look at the table
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMLANE_")}
    env["PYTHONPATH"] = f"{ROOT / 'client_py'}:{ROOT / 'server'}"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with ThreadPoolExecutor(n_sidecars) as pool:
            started = list(
                pool.map(
                    lambda i: start_sidecar(run_dir, f"{prefix}-s{i}", args, prefix, env), range(n_sidecars)
                )
            )
        procs, targets = [p for p, _ in started], [t for _, t in started]
        out = workload(targets, args, prefix)
        tally: Tally = out["tally"]
        out["missing_by_sidecar"] = converge(targets, tally)
        rows = asyncio.run(table_rows(f"s3://{BUCKET}/{prefix}/ltm"))
        acked = set().union(*tally.acked.values())
        out["acked"] = len(acked)
        out["lost"] = len(acked - set(rows))
        out["duplicated"] = sum(1 for i in acked if rows[i] > 1)
        needles = [m.encode() for m in out["marks"].values()] + [v.encode() for v in out["victims"]]
        out["victim_bytes_left"] = leftovers(endpoint, f"{prefix}/", needles)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(120)
        server.send_signal(signal.SIGTERM)
        drop_keys(args.redis_url, prefix)
        lines = [ln for ln in server.communicate(timeout=30)[0].splitlines() if ln.startswith("STATS ")]
    out["s3"] = json.loads(lines[-1][6:]) if lines else {}
    logs = "".join((run_dir / f"{prefix}-s{i}.log").read_text(errors="replace") for i in range(n_sidecars))
    out["logs"] = {label: len(re.findall(re.escape(pat), logs)) for label, pat in LOG_COUNTS.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sidecars", type=int, default=3)
    parser.add_argument("--writers", type=int, default=2, help="writer threads per sidecar")
    parser.add_argument("--writes", type=int, default=30, help="memories each writer creates")
    parser.add_argument("--forget", type=int, default=3, help="victims erased mid-run")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--racy-s3", action="store_true", help="plain moto: conditional puts not atomic")
    parser.add_argument("--keep", action="store_true", help="keep the sidecars' logs (prints where)")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="memlane-bench-sharing-")
    try:
        shared = run(args.sidecars, args, Path(tmp))
        # Baseline: the same writer threads, all through one sidecar (no cross-sidecar conflicts).
        one = argparse.Namespace(**{**vars(args), "writers": args.writers * args.sidecars})
        base = run(1, one, Path(tmp))
    finally:
        if args.keep:
            print(f"logs under {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    report(args, shared, base)


def report(args: argparse.Namespace, shared: dict[str, Any], base: dict[str, Any]) -> None:
    def rate(r: dict[str, Any]) -> float:
        return float(r["acked"] / r["elapsed"])

    def pct(r: dict[str, Any], q: float) -> float:
        lat = sorted(r["tally"].latency)
        return 1000 * lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")

    print(
        f"{args.sidecars} sidecars x {args.writers} writers x {args.writes} CreateMemory, {args.forget}"
        " ForgetUser mid-run, compaction every 1 s, prune every 5 s, one s3:// table"
    )
    for name, r in (("shared", shared), ("1 sidecar", base)):
        t = r["tally"]
        unseen = sum(r["missing_by_sidecar"].values())
        print(
            f"  [{name}] acked {r['acked']}, lost {r['lost']}, duplicated {r['duplicated']}, unseen by a"
            f" sidecar {unseen}, victim rows erased {r['erased']}, victim bytes left in the bucket"
            f" {r['victim_bytes_left']}, searches {t.searches}, failed calls {dict(t.errors) or 0}"
        )
        print(
            f"  [{name}] {rate(r):.1f} writes/s, CreateMemory p50 {pct(r, 0.5):.0f} ms,"
            f" p99 {pct(r, 0.99):.0f} ms; ForgetUser {', '.join(f'{x:.1f}' for x in t.forget_s)} s"
        )
        for label, n in r["logs"].items():
            print(f"  [{name}] {label}: {n}")
        s3 = r["s3"]
        print(
            f"  [{name}] S3: manifest commits (conditional PUTs) {s3.get('conditional_puts')}, refused with"
            f" 412 (a concurrent commit won) {s3.get('refused_412')}, accepted twice (a lost commit)"
            f" {s3.get('lost_to_race')}"
        )
    print(f"  throughput shared / 1 sidecar: {rate(shared) / rate(base):.2f}")
    bad = (
        shared["lost"]
        + shared["duplicated"]
        + shared["victim_bytes_left"]
        + sum(shared["tally"].errors.values())
    )
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
