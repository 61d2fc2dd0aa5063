"""The caller's trace, carried to the sidecar: when OpenTelemetry's API is installed and a span is
active, every call sends the active context through the configured propagator (``OTEL_PROPAGATORS``,
W3C trace context and baggage by default) and, whatever that writes, a W3C ``traceparent`` (what the
sidecar reads), so the sidecar's SERVER span joins the caller's trace. Without the package, or with no
span active, nothing is sent and nothing more is imported.

**The client's own spans** (``CallSpan``), when an OpenTelemetry SDK is installed as the global tracer
provider: a CLIENT span around each call, its retries included, named as the sidecar names its span of
that call (``memlane.v1.ContextService/AssembleContext``) with the RPC attributes, or, for the memory
operations of the OpenTelemetry GenAI memory conventions, by that operation (``search_memory``,
``create_memory``, ``update_memory``, ``delete_memory``) with its ``gen_ai.*`` attributes, as the
sidecar's span inside the call is named. The sidecar's SERVER span is then the CLIENT span's child.
Without an SDK nothing is recorded and the caller's active span is sent as it is.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import grpc

Metadata = tuple[tuple[str, str], ...]


@functools.cache
def _otel() -> tuple[ModuleType, ModuleType] | None:
    """``opentelemetry.trace`` and ``opentelemetry.propagate``, or None without the API (imported once:
    a client-only install need not have it)."""
    try:
        from opentelemetry import propagate, trace  # noqa: PLC0415
    except ImportError:
        return None
    return trace, propagate


def trace_metadata(call: CallSpan | None = None) -> Metadata:
    """The propagation headers of ``call``'s span (when it records one) or else of the active span;
    empty when there is neither."""
    otel = _otel()
    if otel is None:
        return ()
    trace, propagate = otel
    own = call.span if call is not None else None
    context = trace.set_span_in_context(own) if own is not None else None
    span = (own if own is not None else trace.get_current_span()).get_span_context()
    if not span.is_valid:
        return ()
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    carrier.setdefault("traceparent", f"00-{span.trace_id:032x}-{span.span_id:016x}-{span.trace_flags:02x}")
    return tuple(carrier.items())


# The RPCs that are memory operations of the GenAI memory conventions: their spans carry its names.
MEMORY_OPERATIONS = {
    "SearchMemories": "search_memory",
    "CreateMemory": "create_memory",
    "UpdateMemory": "update_memory",
    "DeleteMemory": "delete_memory",
}
# gRPC status numbers (``rpc.grpc.status_code``); every code but OK marks a client span as failed.
_NUMBERS = {code.name: code.value[0] for code in grpc.StatusCode}


class CallSpan:
    """One call's CLIENT span (None when no SDK records it); ``end`` closes it with the call's status.
    Never made current: a stream's span would leak into the caller's code between items."""

    __slots__ = ("operation", "span")

    def __init__(self, service: str, method: str) -> None:
        self.span: Any = None
        self.operation = MEMORY_OPERATIONS.get(method) if service == "memlane.v1.MemoryService" else None
        otel = _otel()
        if otel is None:
            return
        from . import __version__  # noqa: PLC0415  (the package imports this module)

        trace = otel[0]
        attributes: dict[str, Any] = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
        operation = self.operation
        if operation is not None:
            attributes.update(
                {
                    "gen_ai.operation.name": operation,
                    "gen_ai.provider.name": "memlane",
                    "gen_ai.memory.store.id": "ltm",
                }
            )
        span = trace.get_tracer("memlane", __version__).start_span(
            operation or f"{service}/{method}", kind=trace.SpanKind.CLIENT, attributes=attributes
        )
        self.span = span if span.is_recording() else None

    def answered(self, response: Any) -> None:
        """What the response says of the operation (a search's record count)."""
        if self.span is not None and self.operation == "search_memory":
            self.span.set_attribute("gen_ai.memory.record.count", len(response.results))

    def end(self, error: BaseException | None = None) -> None:
        if self.span is None:
            return
        # The typed error the client raises carries the call's status; a consumer leaving a stream
        # early (GeneratorExit) is no error of the call's.
        code = getattr(error, "code", None)
        if error is None or isinstance(error, GeneratorExit):
            self.span.set_attribute("rpc.grpc.status_code", 0)
        else:
            from opentelemetry.trace import Status, StatusCode  # noqa: PLC0415

            name = code.name if isinstance(code, grpc.StatusCode) else type(error).__name__
            if isinstance(code, grpc.StatusCode):
                self.span.set_attribute("rpc.grpc.status_code", _NUMBERS[code.name])
            self.span.set_attribute("error.type", name)
            self.span.set_status(Status(StatusCode.ERROR, name))
        self.span.end()


@contextlib.contextmanager
def operation(name: str) -> Iterator[None]:
    """A span named ``name`` around the calls of one high-level operation (``Memlane.add``: CreateSession
    then AppendMessages), so they share one trace, when OpenTelemetry is present and no span is active;
    under a caller's span they are in its trace already and nothing is added."""
    otel = _otel()
    if otel is None or otel[0].get_current_span().get_span_context().is_valid:
        yield
        return
    from . import __version__  # noqa: PLC0415  (the package imports this module)

    with otel[0].get_tracer("memlane", __version__).start_as_current_span(name):
        yield
