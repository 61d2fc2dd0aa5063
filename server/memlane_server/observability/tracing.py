"""OpenTelemetry tracing of RPCs: a SERVER span per call that continues the caller's W3C trace.

Off unless the standard variables ask for it (``tracing_requested``): ``OTEL_TRACES_EXPORTER`` other than
``none``, or an ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT``; ``OTEL_SDK_DISABLED=true`` wins over both. The
command line then installs the SDK (``configure_tracing``) before the server is built; otherwise the global
tracer provider stays OpenTelemetry's no-op one and ``RpcTracing.start`` returns at once, without reading
the call's metadata.

Spans follow the RPC semantic conventions (name ``memlane.v1.Service/Method``; ``rpc.system``,
``rpc.service``, ``rpc.method``, ``rpc.grpc.status_code``) and carry nothing a caller sent: no message
content, user or session ids, tokens.

**Installing the SDK** (``configure_tracing``, when ``tracing_requested``) reads only the standard
variables: ``OTEL_TRACES_EXPORTER`` (``console``, ``otlp``, comma-separated; default ``otlp`` once an OTLP
endpoint is set), ``OTEL_EXPORTER_OTLP_*`` (endpoint, headers, timeout; OTLP over HTTP/protobuf),
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` (default service name ``memlane``),
``OTEL_TRACES_SAMPLER(_ARG)`` (default: parent-based, always on), ``OTEL_BSP_*`` (batching) and
``OTEL_PROPAGATORS`` (default W3C tracecontext and baggage). The SDK is imported there, inside the function,
so a sidecar without tracing never imports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from memlane import __version__

from ..config import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

_DISABLED = ("OTEL_SDK_DISABLED",)
_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
# gRPC status numbers (rpc.grpc.status_code) and the codes that mark a server span as failed (the RPC
# conventions: the server's fault, not the caller's).
_NUMBERS = {code.name: code.value[0] for code in grpc.StatusCode}
_SERVER_ERRORS = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)


def tracing_requested(env: Mapping[str, str]) -> bool:
    """Whether the standard OTEL_* variables turn tracing on (it is off by default)."""
    if any(env.get(name, "").strip().lower() == "true" for name in _DISABLED):
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return any(e.strip() not in ("", "none") for e in exporters.split(","))
    return any(env.get(name, "").strip() for name in _ENDPOINTS)


class RpcSpan:
    """One call's span, current while the handler runs."""

    __slots__ = ("_span", "_token")

    def __init__(self, span: trace.Span, token: object) -> None:
        self._span, self._token = span, token

    def end(self, code: str) -> None:
        self._span.set_attribute("rpc.grpc.status_code", _NUMBERS.get(code, _NUMBERS["UNKNOWN"]))
        if code in _SERVER_ERRORS:
            self._span.set_status(Status(StatusCode.ERROR, code))
        otel_context.detach(self._token)  # type: ignore[arg-type]
        self._span.end()


class RpcTracing:
    """Starts the span of each RPC under the global tracer provider, as it was when the server was built."""

    def __init__(self, provider: trace.TracerProvider | None = None) -> None:
        provider = provider or trace.get_tracer_provider()
        off = isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))
        self._tracer = None if off else provider.get_tracer("memlane", __version__)

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def start(self, method: str, metadata: Iterable[tuple[str, str | bytes]] | None) -> RpcSpan | None:
        """``method``: the full gRPC method (``/memlane.v1.ContextService/AssembleContext``)."""
        if self._tracer is None:
            return None
        service, _, name = method.lstrip("/").partition("/")
        # traceparent / tracestate (and baggage) as the caller sent them; binary metadata is never context.
        carrier = {k: v for k, v in metadata or () if isinstance(v, str)}
        parent = propagate.extract(carrier)
        span = self._tracer.start_span(
            f"{service}/{name}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
        )
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        return RpcSpan(span, token)


# Installing the SDK: only when the OTEL_* variables ask for tracing.


def _exporter(name: str, env: Mapping[str, str]) -> SpanExporter:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter  # noqa: PLC0415

    if name == "console":
        return ConsoleSpanExporter()
    if name == "otlp":
        protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        if protocol and protocol.strip() != "http/protobuf":
            raise ConfigError(
                f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r}: memlane exports OTLP over http/protobuf"
            )
        return OTLPSpanExporter()  # endpoint, headers, timeout, compression: from OTEL_EXPORTER_OTLP_*
    raise ConfigError(f"OTEL_TRACES_EXPORTER {name!r}: memlane ships the console and otlp exporters")


def configure_tracing(env: Mapping[str, str]) -> TracerProvider:
    """The SDK provider, installed as the global one; call ``shutdown()`` on exit to flush the last spans."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource  # noqa: PLC0415 - only when tracing
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

    resource = Resource.create()  # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if resource.attributes.get(SERVICE_NAME, "unknown_service") == "unknown_service":
        resource = resource.merge(Resource({SERVICE_NAME: "memlane"}))
    names = [n.strip().lower() for n in (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")]
    exporters = [_exporter(n, env) for n in names if n and n != "none"]
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))  # OTEL_BSP_* for batching
    trace.set_tracer_provider(provider)
    return provider
