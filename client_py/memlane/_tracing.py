"""The caller's trace, carried to the sidecar: when OpenTelemetry's API is installed and a span is
active, every call sends the active context through the configured propagator (``OTEL_PROPAGATORS``,
W3C trace context and baggage by default) and, whatever that writes, a W3C ``traceparent`` (what the
sidecar reads), so the sidecar's SERVER span is a child of the caller's span. Without the package, or
with no span active, nothing is sent and nothing more is imported.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from types import ModuleType

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


def trace_metadata() -> Metadata:
    """The active span's propagation headers; empty when no span is active."""
    otel = _otel()
    if otel is None:
        return ()
    trace, propagate = otel
    span = trace.get_current_span().get_span_context()
    if not span.is_valid:
        return ()
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    carrier.setdefault("traceparent", f"00-{span.trace_id:032x}-{span.span_id:016x}-{span.trace_flags:02x}")
    return tuple(carrier.items())


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
