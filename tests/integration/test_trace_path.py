"""Traces through the whole path, read with the SDK's in-memory exporter (the agent, its memlane client
and an in-process sidecar in one process, sharing one tracer provider): an agent's span around
``Memlane.context()`` holds, in one trace, the client's CLIENT span, the sidecar's SERVER span and inside
it assembly's stages, the recall as a ``search_memory`` span with the GenAI memory attributes, the query's
embedding and the Redis calls; memory writes are ``create_memory`` spans (client and sidecar); the
session-end job a close queues is a trace of its own linked to the close's span. Without the GenAI
content opt-in no span carries the query or a memory's content; with it, the search span carries the
query text and the records found with their scores. On the base, the agent's trace held one memlane span
(the RPC's), nothing inside it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import delete_prefix

AGENT = """
import json, sys, time
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)  # before the sidecar is built: its RPC tracing reads it then
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

import memlane
from memlane import Caller, MemoryKind
from memlane_server.background import SidecarThread
from memlane_server.config import build_settings

redis_url, prefix, data_dir, user, sid = sys.argv[1:6]
settings = build_settings(
    flags={"listen": "127.0.0.1:0", "admin_listen": "", "redis_url": redis_url, "key_prefix": prefix,
           "data_dir": data_dir, "worker_processes": 0, "shutdown_grace_seconds": 1.0},
    env={},
)
sidecar = SidecarThread(settings).start()
tracer = provider.get_tracer("agent")
ids = {}
try:
    with memlane.Memlane(sidecar.target, agent_id="traced-bot") as m:
        with tracer.start_as_current_span("agent-remember") as span:
            m.remember(user, "User's parcel 3318 waits at the Elm Street depot.")
        ids["remember"] = span.get_span_context().trace_id
        m.add(user, sid, [{"role": "user", "content": "Hello there, my locker is number 17."}])
        with tracer.start_as_current_span("agent-turn") as span:
            m.context(sid, "Where is parcel 3318 waiting?")
        ids["turn"] = span.get_span_context().trace_id
        with tracer.start_as_current_span("agent-close") as span:
            m.client.close_session(session_id=sid)
        ids["close"] = span.get_span_context().trace_id
        # Until the session end has run: the job that promotes it may be handed back once while the
        # facts job of its last turn holds the session's lease, and run again.
        deadline = time.monotonic() + 60
        archived = memlane.PromotionState.PROMOTION_STATE_ARCHIVED
        while m.client.get_session(session_id=sid).session.promotion_state != archived:
            assert time.monotonic() < deadline, "the session did not end"
            time.sleep(0.1)
finally:
    sidecar.stop()
out = []
for s in exporter.get_finished_spans():
    out.append({
        "name": s.name, "kind": s.kind.name, "trace": s.context.trace_id, "id": s.context.span_id,
        "parent": s.parent.span_id if s.parent else None, "attributes": dict(s.attributes or {}),
        "links": [[l.context.trace_id, l.context.span_id] for l in s.links],
    })
durations = [
    [dict(p.attributes), p.count, p.sum]
    for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    if m.name == "gen_ai.retrieval.duration" for p in m.data.data_points
]
print(json.dumps({"ids": ids, "spans": out, "durations": durations}))
"""


# What one agent run recorded: the trace ids of its spans by purpose, every span, the retrieval-duration
# points (attributes, count, sum).
Run = tuple[dict[str, int], list[dict[str, Any]], list[list[Any]]]


def run_agent(redis_url: str, tmp_path: Path, *, capture: bool) -> Run:
    prefix, user, sid = (
        f"tp{uuid.uuid4().hex[:10]}",
        f"u-{uuid.uuid4().hex[:6]}",
        f"chat-{uuid.uuid4().hex[:8]}",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MEMLANE_"))}
    if capture:
        env["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = "true"
    try:
        out = subprocess.run(
            [sys.executable, "-c", AGENT, redis_url, prefix, str(tmp_path / "data"), user, sid],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            check=False,
        )
    finally:
        delete_prefix(redis_url, prefix)
    assert out.returncode == 0, out.stderr[-4000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    spans: list[dict[str, Any]] = found["spans"]
    return found["ids"], spans, found["durations"]


def under(spans: list[dict[str, Any]], root: str, trace_id: int) -> list[dict[str, Any]]:
    """Every span of ``trace_id`` that descends from the span named ``root`` (parent links unbroken)."""
    mine = {s["id"]: s for s in spans if s["trace"] == trace_id}
    (top,) = [s for s in mine.values() if s["name"] == root]
    out = []
    for s in mine.values():
        at = s
        while at["parent"] is not None and at["id"] != top["id"]:
            at = mine[at["parent"]]
        if at["id"] == top["id"] and s is not top:
            out.append(s)
    return out


def parent_of(spans: list[dict[str, Any]], span: dict[str, Any]) -> dict[str, Any]:
    (parent,) = [s for s in spans if s["id"] == span["parent"]]
    return parent


@pytest.fixture(scope="module")
def traced(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Run:
    return run_agent(redis_url, tmp_path_factory.mktemp("trace"), capture=False)


def test_the_agents_span_around_context_holds_the_whole_path(
    traced: Run,
) -> None:
    ids, spans, durations = traced
    inside = under(spans, "agent-turn", ids["turn"])
    names = [s["name"] for s in inside]
    rpc = "memlane.v1.ContextService/AssembleContext"
    (client,) = [s for s in inside if s["name"] == rpc and s["kind"] == "CLIENT"]
    (server,) = [s for s in inside if s["name"] == rpc and s["kind"] == "SERVER"]
    assert server["parent"] == client["id"]
    assert client["attributes"]["rpc.grpc.status_code"] == 0
    # Assembly's stages, inside the server's span.
    for stage in ("session", "profile", "history", "procedures", "fold"):
        assert f"memlane.assemble.{stage}" in names, (stage, names)
    # The recall, by the GenAI memory conventions.
    (search,) = [s for s in inside if s["name"] == "search_memory"]
    a = search["attributes"]
    assert a["gen_ai.operation.name"] == "search_memory"
    assert a["gen_ai.provider.name"] == "memlane"
    assert a["gen_ai.memory.store.id"] == "ltm"
    assert a["gen_ai.retrieval.top_k"] >= 1
    assert a["gen_ai.memory.record.count"] >= 1
    assert "gen_ai.memory.query.text" not in a and "gen_ai.memory.records" not in a  # opt-in only
    # The query's embedding, inside the search; Redis calls, as database client spans.
    embeddings = [s for s in inside if s["name"].startswith("embeddings")]
    assert embeddings and all(s["attributes"]["gen_ai.operation.name"] == "embeddings" for s in embeddings)
    assert any(parent_of(spans, s)["name"] == "search_memory" for s in embeddings)
    redis = [s for s in inside if s["attributes"].get("db.system.name") == "redis"]
    assert redis and all(s["kind"] == "CLIENT" for s in redis)
    # The retrieval duration metric (OpenTelemetry metrics API), one point per search.
    assert [(p[0], p[1] >= 1, p[2] > 0) for p in durations] == [
        ({"gen_ai.operation.name": "search_memory", "gen_ai.provider.name": "memlane"}, True, True)
    ]
    # Nothing the caller sent, with the content opt-in off.
    dumped = json.dumps(spans)
    for sent in ("parcel 3318", "Elm Street", "locker is number"):
        assert sent not in dumped, sent


def test_memory_writes_and_jobs_are_traced(traced: Run) -> None:
    ids, spans, _ = traced
    inside = under(spans, "agent-remember", ids["remember"])
    (client,) = [s for s in inside if s["name"] == "create_memory" and s["kind"] == "CLIENT"]
    (server,) = [s for s in inside if s["name"] == "create_memory" and s["kind"] == "INTERNAL"]
    assert client["attributes"]["gen_ai.operation.name"] == "create_memory"
    assert server["attributes"]["gen_ai.memory.record.id"]
    assert server["attributes"]["gen_ai.memory.record.count"] == 1
    assert any(s["attributes"].get("db.system.name") == "lancedb" for s in inside)
    # The session-end job the close queued: a trace of its own, linked to the close's server span.
    (close,) = [
        s
        for s in under(spans, "agent-close", ids["close"])
        if s["name"] == "memlane.v1.SessionService/CloseSession" and s["kind"] == "SERVER"
    ]
    jobs = [s for s in spans if s["name"] == "memlane.job closed"]
    assert jobs, [s["name"] for s in spans]
    # One run, or two when the first was handed back (the facts job of the last turn held the lease).
    for job in jobs:
        assert job["kind"] == "CONSUMER" and job["parent"] is None and job["trace"] != ids["close"]
        assert job["links"] == [[ids["close"], close["id"]]]
    work = [s for job in jobs for s in under(spans, "memlane.job closed", job["trace"])]  # their own work
    assert any(s["attributes"].get("db.system.name") == "redis" for s in work)
    (promoted,) = [s for s in work if s["name"] == "create_memory"]  # the session's turns, learnt
    assert promoted["attributes"]["gen_ai.memory.record.count"] >= 1


def test_the_content_opt_in_adds_the_query_and_the_records_with_their_scores(
    redis_url: str, tmp_path: Path
) -> None:
    ids, spans, _ = run_agent(redis_url, tmp_path, capture=True)
    (search,) = [s for s in under(spans, "agent-turn", ids["turn"]) if s["name"] == "search_memory"]
    assert search["attributes"]["gen_ai.memory.query.text"] == "Where is parcel 3318 waiting?"
    records = json.loads(search["attributes"]["gen_ai.memory.records"])
    assert records and {"id", "score"} == set(records[0])
    assert len(records) == search["attributes"]["gen_ai.memory.record.count"]
