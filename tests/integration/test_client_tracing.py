"""The Python clients carry the caller's OpenTelemetry trace to a real ``memlane serve`` process (tracing
on through the standard variables, console exporter): under an agent's span the sidecar's SERVER spans
of ``Memlane.add`` and ``Memlane.context`` are children of that span; with no span active one
``Memlane.add()`` is one trace (a ``memlane.add`` span of the client's, its two calls under it);
``propagate_trace=False`` leaves the calls out; extra metadata and the caller's gRPC interceptors
(blocking and asyncio) run on every call."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import memlane
from tests.conftest import delete_prefix, wait_for
from tests.integration.test_session_end_pipeline import SidecarProcess
from tests.integration.test_tracing import spans_in

CREATE = "memlane.v1.SessionService/CreateSession"
APPEND = "memlane.v1.SessionService/AppendMessages"
ASSEMBLE = "memlane.v1.ContextService/AssembleContext"
LIST = "memlane.v1.SessionService/ListSessions"


@pytest.fixture(scope="module")
def sidecar(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    tmp, prefix = tmp_path_factory.mktemp("client-tracing"), f"ct{uuid.uuid4().hex[:10]}"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_TRACES_EXPORTER", "console")
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        proc = SidecarProcess(
            tmp, "t", redis_url, prefix, tmp / "data", worker_processes=0, ltm_enabled="false"
        )
    try:
        yield proc
    finally:
        proc.stop()
        delete_prefix(redis_url, prefix)


def server_spans(sidecar: SidecarProcess, trace_id: int, names: set[str]) -> dict[str, dict[str, Any]]:
    """The sidecar's spans of ``names`` in trace ``trace_id``, polled for (the exporter writes batches)."""

    def found() -> dict[str, dict[str, Any]] | None:
        spans = spans_in(sidecar.log.read_text())
        mine = {s["name"]: s for s in spans if s["context"]["trace_id"] == f"0x{trace_id:032x}"}
        return mine if names <= mine.keys() else None

    spans: dict[str, dict[str, Any]] = wait_for(found, timeout=60, describe=sidecar.log.read_text)
    return spans


def test_the_sidecars_spans_are_children_of_the_agents_span(sidecar: SidecarProcess) -> None:
    # A provider of the test's own (not the global one): the client reads the active span from the
    # context, whichever provider made it.
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("agent")
    sid = f"chat-{uuid.uuid4().hex[:8]}"
    with memlane.Memlane(sidecar.target, agent_id="traced-bot") as m:
        with tracer.start_as_current_span("agent-turn") as span:
            m.add(f"u-{uuid.uuid4().hex[:6]}", sid, [{"role": "user", "content": "Where is parcel 3318?"}])
            m.context(sid, "Where is parcel 3318?")
        # Positive control: after the span, a call starts a trace of its own.
        m.context(sid, "and now?")
    ctx = span.get_span_context()
    spans = server_spans(sidecar, ctx.trace_id, {CREATE, APPEND, ASSEMBLE})
    for name in (CREATE, APPEND, ASSEMBLE):
        assert spans[name]["parent_id"] == f"0x{ctx.span_id:016x}", name
    assert [s.name for s in exporter.get_finished_spans()] == ["agent-turn"]  # no memlane.add under it

    # The exporter writes in batches: wait for both assemblies' spans before comparing their traces.
    def both_assembles() -> list[dict[str, Any]] | None:
        found = [s for s in spans_in(sidecar.log.read_text()) if s["name"] == ASSEMBLE]
        return found if len(found) >= 2 else None

    assembles = wait_for(both_assembles, timeout=60, describe=sidecar.log.read_text)
    assert len({s["context"]["trace_id"] for s in assembles}) == 2


# Run in a process of its own: it installs a global tracer provider, which lasts for the process.
ONE_ADD = """
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import memlane

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
with memlane.Memlane(sys.argv[1], agent_id="traced-bot") as m:
    m.add(sys.argv[2], sys.argv[3], [{"role": "user", "content": "hello"}])
print(json.dumps([
    [s.name, s.kind.name, s.context.trace_id, s.context.span_id, s.parent.span_id if s.parent else None]
    for s in exporter.get_finished_spans()
]))
"""


def test_one_add_is_one_trace_without_a_callers_span(sidecar: SidecarProcess) -> None:
    """With an SDK installed, each call is a CLIENT span of the client's, named as the sidecar names its
    SERVER span of it, under the ``memlane.add`` span; the SERVER spans are the CLIENT spans' children."""
    user, sid = f"u-{uuid.uuid4().hex[:6]}", f"chat-{uuid.uuid4().hex[:8]}"
    out = subprocess.run(
        [sys.executable, "-c", ONE_ADD, sidecar.target, user, sid],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    found = json.loads(out.stdout)
    ((_, _, trace_id, add_id, _),) = [s for s in found if s[0] == "memlane.add"]
    calls = {name: (kind, span_id, parent) for name, kind, t, span_id, parent in found if t == trace_id}
    assert set(calls) == {"memlane.add", CREATE, APPEND}
    for name in (CREATE, APPEND):
        assert calls[name][0] == "CLIENT" and calls[name][2] == add_id, name
    spans = server_spans(sidecar, trace_id, {CREATE, APPEND})
    assert spans[CREATE]["parent_id"] == f"0x{calls[CREATE][1]:016x}"
    assert spans[APPEND]["parent_id"] == f"0x{calls[APPEND][1]:016x}"


class _Recorder(grpc.UnaryUnaryClientInterceptor):
    """Records the metadata of each call it sees."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.seen.append(dict(details.metadata or ()))
        return continuation(details, request)


class _AsyncRecorder(grpc.aio.UnaryUnaryClientInterceptor):
    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.seen.append(dict(details.metadata or ()))
        return await continuation(details, request)


async def test_metadata_interceptors_and_opting_out(sidecar: SidecarProcess) -> None:
    tracer = TracerProvider().get_tracer("agent")
    extra = [("x-request-source", "nightly-batch")]
    sync_rec, async_rec, quiet_rec = _Recorder(), _AsyncRecorder(), _Recorder()
    with tracer.start_as_current_span("agent-turn") as span:
        with memlane.Client(sidecar.target, metadata=extra, interceptors=[sync_rec]) as c:
            c.list_sessions(user_id="nobody", page_size=1)
        async with memlane.AsyncClient(sidecar.target, metadata=extra, interceptors=[async_rec]) as ac:
            await ac.list_sessions(user_id="nobody", page_size=1)
        with memlane.Client(sidecar.target, interceptors=[quiet_rec], propagate_trace=False) as c:
            c.list_sessions(user_id="nobody", page_size=1)
    ctx = span.get_span_context()
    traceparent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"
    for seen in (sync_rec.seen, async_rec.seen):
        assert [(md.get("traceparent"), md.get("x-request-source")) for md in seen] == [
            (traceparent, "nightly-batch")
        ]
    assert [md.get("traceparent") for md in quiet_rec.seen] == [None]
    # The two propagating calls are in the agent's trace; the opted-out one is not.
    wait_for(
        lambda: (
            len(
                [
                    s
                    for s in spans_in(sidecar.log.read_text())
                    if s["name"] == LIST and s["context"]["trace_id"] == f"0x{ctx.trace_id:032x}"
                ]
            )
            == 2
        ),
        timeout=60,
    )
