"""OpenTelemetry tracing of a real ``memlane serve`` process, configured only by the standard OTEL_*
variables: with ``OTEL_TRACES_EXPORTER=console`` an AssembleContext sent with a W3C ``traceparent``
produces its SERVER span in the caller's trace (child of the caller's span), and no span carries what the
caller sent. Tracing is off unless the variables ask for it."""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry import trace

import memlane
from memlane import Message, Role
from memlane.v1 import context_pb2, context_pb2_grpc
from memlane_server.observability.tracing import RpcTracing, tracing_requested
from tests.conftest import delete_prefix
from tests.integration.test_session_end_pipeline import SidecarProcess

ASSEMBLE = "memlane.v1.ContextService/AssembleContext"


@pytest.fixture()
def prefix(redis_url: str) -> Iterator[str]:
    p = f"tr{uuid.uuid4().hex[:10]}"
    yield p
    delete_prefix(redis_url, p)


def spans_in(text: str) -> list[dict[str, Any]]:
    """The console exporter's spans (indented JSON objects) among the sidecar's log lines."""
    decoder = json.JSONDecoder()
    spans, at = [], 0
    while (start := text.find("{\n", at)) >= 0:
        try:
            obj, at = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            at = start + 1
            continue
        if isinstance(obj, dict) and "context" in obj and "kind" in obj:
            spans.append(obj)
    return spans


def test_assemble_context_continues_the_callers_trace(
    redis_url: str, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "memlane-under-test")
    sidecar = SidecarProcess(
        tmp_path, "t", redis_url, prefix, tmp_path / "data", worker_processes=0, ltm_enabled="false"
    )
    user, secret = f"user-{secrets.token_hex(4)}", f"my passphrase is {secrets.token_hex(8)}"
    try:
        with memlane.Client(sidecar.target, agent_id="a1") as c:
            sid = c.create_session(user_id=user, agent_id="a1").session.session_id
            c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content=secret)])
        trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
        with grpc.insecure_channel(sidecar.target) as channel:
            stub = context_pb2_grpc.ContextServiceStub(channel)
            request = context_pb2.AssembleContextRequest(session_id=sid, user_input=secret, model="gpt-4o")
            metadata = (("traceparent", f"00-{trace_id}-{parent_id}-01"), ("x-memlane-agent", "a1"))
            chunks = list(stub.AssembleContext(request, metadata=metadata, timeout=30))
        assert chunks  # the assembly ran
    finally:
        sidecar.stop()  # SIGTERM: the SDK flushes its last batch on the way out
    log = sidecar.log.read_text()
    spans = spans_in(log)
    (span,) = [s for s in spans if s["name"] == ASSEMBLE]
    assert span["context"]["trace_id"] == f"0x{trace_id}"
    assert span["parent_id"] == f"0x{parent_id}"
    assert span["kind"] == "SpanKind.SERVER"
    assert span["status"]["status_code"] == "UNSET"
    assert span["attributes"] == {
        "rpc.system": "grpc",
        "rpc.service": "memlane.v1.ContextService",
        "rpc.method": "AssembleContext",
        "rpc.grpc.status_code": 0,
    }
    assert span["resource"]["attributes"]["service.name"] == "memlane-under-test"
    # The calls without a traceparent were traced too, each as a root of its own trace (their SERVER
    # spans; the spans inside a call are its children).
    others = [s for s in spans if s["name"] != ASSEMBLE and s["kind"] == "SpanKind.SERVER"]
    assert {s["name"] for s in others} >= {
        "memlane.v1.SessionService/CreateSession",
        "memlane.v1.SessionService/AppendMessages",
    }
    assert all(s["parent_id"] is None and s["context"]["trace_id"] != f"0x{trace_id}" for s in others)
    # Nothing the caller sent reaches a span: no content, no user or session id.
    dumped = json.dumps(spans)
    for sent in (secret, user, sid):
        assert sent not in dumped, sent


def test_tracing_is_off_unless_the_standard_variables_ask() -> None:
    assert not tracing_requested({})
    assert not tracing_requested({"OTEL_TRACES_EXPORTER": "none"})
    assert not tracing_requested({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"})
    assert not tracing_requested({"MEMLANE_TRACING": "on"})  # no variable of memlane's own
    assert tracing_requested({"OTEL_TRACES_EXPORTER": "console"})
    assert tracing_requested({"OTEL_TRACES_EXPORTER": "none,otlp"})
    assert tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert tracing_requested({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    # Without the SDK installed (the global provider is then OpenTelemetry's proxy), an RPC starts no span.
    for provider in (trace.ProxyTracerProvider(), trace.NoOpTracerProvider()):
        tracing = RpcTracing(provider)
        assert not tracing.enabled
        parent = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
        assert tracing.start("/memlane.v1.SessionService/GetSession", [("traceparent", parent)]) is None
