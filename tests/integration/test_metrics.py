"""The Prometheus scrape of a real sidecar: process and build metrics, domain gauges sampled from Redis
and LanceDB, pipeline step and assembly metrics, and a scrape that ``promtool check metrics`` accepts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import memlane
from memlane import Message, Role
from memlane.v1 import memory_pb2 as mpb
from memlane_server.background import SidecarThread
from memlane_server.config import Settings
from memlane_server.infra.redis_pool import FAMILIES
from memlane_server.infra.redis_server import EmbeddedRedis
from tests.conftest import ServerFactory, wait_for
from tests.integration.test_pod_faults import Pod

# CI installs promtool (.ci/run) and sets this, so a missing tool fails there instead of skipping.
REQUIRE_TOOLS = os.environ.get("MEMLANE_REQUIRE_TOOLS") == "1"


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if REQUIRE_TOOLS:
            pytest.fail("promtool is not installed (Debian: apt-get install prometheus)")
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return path


def scrape(sidecar: SidecarThread) -> str:
    port = sidecar.sidecar.admin_port
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return str(r.read().decode())


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of one series in a text-format scrape (labels must match exactly the given ones)."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.match(r"^([a-zA-Z_:][\w:]*)(\{.*\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return None


@pytest.fixture(scope="module")
def metered(start_server: ServerFactory) -> SidecarThread:
    return start_server(admin_listen="127.0.0.1:0", metrics_sample_interval_seconds=0.2)


@pytest.fixture(scope="module")
def c(metered: SidecarThread) -> Iterator[memlane.Client]:
    with memlane.Client(metered.target, timeout=30) as client:
        yield client


def test_process_and_build_metrics_without_created_series(metered: SidecarThread) -> None:
    text = scrape(metered)
    assert sample(text, "process_resident_memory_bytes")
    assert sample(text, "process_open_fds")
    assert sample(text, "process_cpu_seconds_total") is not None
    assert sample(text, "python_gc_collections_total", generation="0") is not None
    assert sample(text, "memlane_build_info", version=memlane.__version__) == 1
    assert "memlane_rpc_duration_seconds" in text  # the positive control for the next line
    assert not [line for line in text.splitlines() if "_created" in line]


def test_domain_gauges_follow_the_stores(metered: SidecarThread, c: memlane.Client) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    open_sid = c.create_session(user_id=user, agent_id="a1").session.session_id
    closed_sid = c.create_session(user_id=user, agent_id="a1").session.session_id
    for sid in (open_sid, closed_sid):
        c.append_messages(
            session_id=sid,
            messages=[
                Message(role=Role.ROLE_USER, content=f"My favourite city is Lisbon, turn {i}.")
                if i % 2 == 0
                else Message(role=Role.ROLE_ASSISTANT, content=f"Noted, turn {i}. " + "filler words " * 20)
                for i in range(40)
            ],
        )
    c.create_memory(
        caller=mpb.Caller(user_id=user, agent_id="a1"),
        kind=mpb.MEMORY_KIND_PREFERENCE,
        content="Prefers window seats.",
    )
    c.close_session(session_id=closed_sid)

    def settled() -> str | None:
        text = scrape(metered)
        ok = (
            (sample(text, "memlane_sessions", status="active") or 0) >= 1
            and (sample(text, "memlane_sessions", status="closed") or 0) >= 1
            and (sample(text, "memlane_ltm_items", kind="preference") or 0) >= 1
            and (sample(text, "memlane_pipeline_step_duration_seconds_count", step="job") or 0) >= 1
            and (sample(text, "memlane_pipeline_step_duration_seconds_count", step="archive") or 0) >= 1
        )
        return text if ok else None

    text = wait_for(settled, timeout=60)
    assert sample(text, "memlane_sessions", status="expired") == 0  # every status reported, even empty
    assert sample(text, "memlane_backend_up", backend="redis") == 1
    assert (sample(text, "memlane_backend_latency_seconds_count", backend="redis", op="ping") or 0) >= 1
    assert (
        sample(text, "memlane_backend_latency_seconds_count", backend="lancedb", op="count_by_kind") or 0
    ) >= 1
    assert sample(text, "memlane_session_end_queue_depth") is not None
    assert sample(text, "memlane_session_end_queue_oldest_age_seconds") is not None
    assert sample(text, "memlane_session_end_parked_jobs") == 0
    assert sample(text, "memlane_pipeline_step_failures_total", step="job") is None  # none failed

    # Assembly in a tiny window leaves turns out: counted by section, with the summary lag observed.
    before = sample(text, "memlane_assembly_truncations_total", section="history") or 0
    for _ in c.assemble_context(
        session_id=open_sid, user_input="where do I like to go?", context_window_tokens=400
    ):
        pass
    text = scrape(metered)
    assert (sample(text, "memlane_assembly_truncations_total", section="history") or 0) > before
    assert (sample(text, "memlane_summarization_lag_messages_count") or 0) >= 1

    # The same recall query twice: the second embedding comes from the cache.
    caller = mpb.Caller(user_id=user, agent_id="a1")
    hits_before = sample(text, "memlane_cache_hits_total", cache="recall_embedding") or 0
    lance = {
        op: sample(text, "memlane_backend_latency_seconds_count", backend="lancedb", op=op) or 0
        for op in ("keyword_search", "vector_search")
    }
    for _ in range(2):
        assert c.search_memories(caller=caller, query="which seat does she like?").results
    text = scrape(metered)
    assert (sample(text, "memlane_cache_hits_total", cache="recall_embedding") or 0) > hits_before
    # Words and vectors both came from the reader's in-memory entry: recall asked LanceDB nothing.
    assert (sample(text, "memlane_cache_hits_total", cache="recall_index") or 0) >= 1
    for op, n in lance.items():
        assert (sample(text, "memlane_backend_latency_seconds_count", backend="lancedb", op=op) or 0) == n, op


def cache_counts(text: str, cache: str) -> tuple[float, float]:
    hits = sample(text, "memlane_cache_hits_total", cache=cache)
    misses = sample(text, "memlane_cache_misses_total", cache=cache)
    assert hits is not None and misses is not None, f"no {cache} cache series"
    return hits, misses


def test_profile_and_token_count_caches_count_hits_and_misses(
    metered: SidecarThread, c: memlane.Client
) -> None:
    user = f"u-{uuid.uuid4().hex[:8]}"
    sid = c.create_session(user_id=user, agent_id="a1").session.session_id
    c.append_messages(
        session_id=sid,
        messages=[
            Message(role=Role.ROLE_USER, content="Please book me an aisle seat to Lisbon."),
            Message(role=Role.ROLE_ASSISTANT, content="Booked: seat 14C, aisle."),
        ],
    )
    c.create_memory(
        caller=mpb.Caller(user_id=user, agent_id="a1"),
        kind=mpb.MEMORY_KIND_PREFERENCE,
        content="Prefers aisle seats.",
    )
    text = scrape(metered)
    profile_before, counts_before = cache_counts(text, "profile"), cache_counts(text, "token_counts")

    # A model in another encoding than the session's (cl100k): the first assembly tokenizes both
    # turns (misses), the second reuses those counts (hits); its profile comes from the cache.
    for _ in range(2):
        blocks = [
            b
            for r in c.assemble_context(session_id=sid, model="gpt-4o", user_input="seat?")
            for b in r.blocks
        ]
        assert any("Prefers aisle seats." in m.content for b in blocks for m in b.messages)
    text = scrape(metered)
    profile, counts = cache_counts(text, "profile"), cache_counts(text, "token_counts")
    assert profile[1] >= profile_before[1] + 1 and profile[0] >= profile_before[0] + 1
    assert counts[1] >= counts_before[1] + 2 and counts[0] >= counts_before[0] + 2

    # The third assembly in the session's own encoding reuses the counts stored with the turns.
    list(c.assemble_context(session_id=sid, user_input="seat?"))
    hits_now = cache_counts(scrape(metered), "token_counts")[0]
    assert hits_now >= counts[0] + 2


def test_redis_round_trips_are_timed_by_command_family(metered: SidecarThread, c: memlane.Client) -> None:
    before = scrape(metered)
    sid = c.create_session(user_id=f"u-{uuid.uuid4().hex[:8]}", agent_id="a1").session.session_id
    c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="hello")])
    assert c.list_messages(session_id=sid).messages
    text = scrape(metered)
    counts = {
        op: sample(text, "memlane_backend_latency_seconds_count", backend="redis", op=op) or 0
        for op in FAMILIES
    }
    moved = {
        op
        for op, n in counts.items()
        if n > (sample(before, "memlane_backend_latency_seconds_count", backend="redis", op=op) or 0)
    }
    assert moved, counts  # the positive control for the bound below
    assert moved & {"script", "pipeline"}, moved  # appends go through Lua or MULTI/EXEC
    # Bounded: every redis series is a known family (or the sampler's ping probe).
    ops = set(re.findall(r'memlane_backend_latency_seconds_count\{backend="redis",op="([^"]*)"\}', text))
    assert ops and ops <= {*FAMILIES, "ping"}, ops


def test_promtool_accepts_a_real_scrape(metered: SidecarThread, c: memlane.Client) -> None:
    tool = promtool()
    c.create_session(user_id="promtool", agent_id="a1")
    text = scrape(metered)
    out = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    # The checker is strict enough to fail: a counter without _total is a lint error (positive control).
    bad = "# HELP bad_counter x\n# TYPE bad_counter counter\nbad_counter 1\n"
    out = subprocess.run([tool, "check", "metrics"], input=bad, capture_output=True, text=True, check=False)
    assert out.returncode != 0


def _backend_errors(text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("memlane_backend_errors_total{") and 'backend="redis"' in line
    )


def test_normal_redis_replies_are_not_backend_errors(start_server: ServerFactory, tmp_path: Path) -> None:
    """A fresh Redis answers a script's first EVALSHA with NOSCRIPT (redis-py loads it and retries) and a
    second sidecar's XGROUP CREATE with BUSYGROUP: replies of a healthy server, which an alert on
    memlane_backend_errors_total must not fire for."""
    fresh = EmbeddedRedis(tmp_path / "redis", persist=False, fsync=Settings().redis.embedded_redis_fsync)
    fresh.start()
    try:
        prefix = f"t{uuid.uuid4().hex[:10]}"
        first = start_server(admin_listen="127.0.0.1:0", redis_url=fresh.url, key_prefix=prefix)
        with memlane.Client(first.target, timeout=30) as c:
            sid = c.create_session(user_id="u-noscript").session.session_id
            c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="hello")])
            c.get_session(session_id=sid)
        second = start_server(admin_listen="127.0.0.1:0", redis_url=fresh.url, key_prefix=prefix)
        with memlane.Client(second.target, timeout=30) as c:
            c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="again")])
        assert _backend_errors(scrape(first)) == 0 and _backend_errors(scrape(second)) == 0
        # Positive control: a real failure (Redis out of memory refuses writes) is counted.
        r = redis.Redis.from_url(fresh.url)
        r.config_set("maxmemory-policy", "noeviction")
        r.config_set("maxmemory", "1")
        try:
            with (
                memlane.Client(first.target, timeout=30, retry=memlane.NO_RETRY) as c,
                pytest.raises(memlane.MemlaneError),
            ):
                c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="x")])
        finally:
            r.config_set("maxmemory", "0")
            r.close()
        assert _backend_errors(scrape(first)) >= 1
    finally:
        fresh.stop()


def _documented_metrics() -> set[str]:
    """Every metric name written in a table row of docs/operations.md (in backticks)."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
    names: set[str] = set()
    for line in docs.read_text().splitlines():
        if line.startswith("|"):
            names |= set(re.findall(r"`([a-zA-Z_:][a-zA-Z0-9_:]*)", line))
    return names


def test_a_pod_with_workers_reads_right_and_every_family_is_documented(tmp_path: Path) -> None:
    """On 3af1f4b a healthy pod's scrape held ``memlane_health_serving{worker="0"} 0`` (the worker
    process's own gauge, never set), so ``min()`` over a pod read 0 while all was well; its gRPC
    connection gauges read 0 too. A worker exports none of the pod's gauges now. And every family a real
    ``memlane serve`` exports (the serving process's, the model process's users', a worker's) has its row
    in docs/operations.md's tables."""
    pod = Pod(tmp_path, "m", tmp_path / "data", worker_processes=1, ltm_enabled="true")
    try:

        def with_worker() -> str | None:
            scraped = pod.http("/metrics")[1]
            return scraped if 'worker="0"' in scraped else None

        text = wait_for(with_worker, timeout=120)
    finally:
        pod.stop()
    serving = [line for line in text.splitlines() if line.startswith("memlane_health_serving")]
    assert serving == ["memlane_health_serving 1.0"], serving
    assert not [
        line for line in text.splitlines() if "memlane_grpc_connections" in line and "worker=" in line
    ]
    # Positive control: the worker's own metrics are in the scrape, labelled.
    assert sample(text, "memlane_embedding_texts_total", lane="bulk", worker="0") is not None
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert {"memlane_health_serving", "memlane_part_up", "memlane_rpc_duration_seconds"} <= families
    missing = sorted(families - _documented_metrics())
    assert missing == [], f"exported but not in docs/operations.md's tables: {missing}"
