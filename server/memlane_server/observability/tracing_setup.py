"""Installs the OpenTelemetry SDK from the standard OTEL_* variables, when ``tracing.tracing_requested``.

Only the standard variables: ``OTEL_TRACES_EXPORTER`` (``console``, ``otlp``, comma-separated; default
``otlp`` once an OTLP endpoint is set), ``OTEL_EXPORTER_OTLP_*`` (endpoint, headers, timeout; OTLP over
HTTP/protobuf), ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` (default service name ``memlane``),
``OTEL_TRACES_SAMPLER(_ARG)`` (default: parent-based, always on), ``OTEL_BSP_*`` (batching) and
``OTEL_PROPAGATORS`` (default W3C tracecontext and baggage). Kept apart from ``tracing`` so that a
sidecar without tracing never imports the SDK.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

from ..config import ConfigError


def _exporter(name: str, env: Mapping[str, str]) -> SpanExporter:
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
