"""Spans inside a traced call: what a request's SERVER span (``tracing.py``) holds, and the traces of
background jobs, linked to the request that queued them.

Nothing here starts a span unless one is being recorded already (``span``, ``traced``, ``record``): with
tracing off, or on a path no traced call leads to, each costs one context lookup. A background job
(``job_span``) is a trace of its own, started when the SDK is installed, with a link to the span that
queued it (its W3C ``traceparent``, carried in the job).

Names and attributes follow OpenTelemetry's conventions:

- **memory** (GenAI memory spans): ``search_memory``, ``create_memory``, ``update_memory``,
  ``delete_memory``, with ``gen_ai.operation.name``, ``gen_ai.provider.name`` (``memlane``),
  ``gen_ai.memory.store.id`` (``ltm``: the long-term memory), ``gen_ai.memory.record.id`` (one record),
  ``gen_ai.memory.record.count`` and, on a search, ``gen_ai.retrieval.top_k``;
- **embedding** (GenAI embeddings): ``embeddings {model}``, ``gen_ai.operation.name`` ``embeddings``;
- **Redis and LanceDB** (database client spans): the command or operation as the name,
  ``db.system.name`` and ``db.operation.name``, never a key or a query;
- **assembly's stages**: ``memlane.assemble.{stage}``.

What a caller sent stays out of spans (no content, user or session id, key) unless the standard GenAI
content opt-in asks for it: with ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` set to ``true``
(or ``span_only`` / ``span_and_event``) a search span carries its query text
(``gen_ai.memory.query.text``) and the records found with their scores (``gen_ai.memory.records``:
``[{"id", "score"}]``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

T = TypeVar("T")
Attributes = Mapping[str, AttributeValue]

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
PROVIDER = "memlane"
LTM_STORE = "ltm"
SEARCH, CREATE, UPDATE, DELETE = "search_memory", "create_memory", "update_memory", "delete_memory"

_OFF: AbstractContextManager[None] = contextlib.nullcontext()
# The global provider's once the SDK is installed (a proxy until then). No version: this module is imported
# by the model process too, which loads no more of memlane than it needs.
_tracer = trace.get_tracer("memlane")


def active() -> bool:
    """Whether a span is being recorded here (a traced request or job is running)."""
    return trace.get_current_span().is_recording()


def span(
    name: str, *, kind: SpanKind = SpanKind.INTERNAL, attributes: Attributes | None = None
) -> AbstractContextManager[trace.Span | None]:
    """A child span of the current one, current while the block runs; nothing when none is recorded."""
    if not trace.get_current_span().is_recording():
        return _OFF
    return _tracer.start_as_current_span(name, kind=kind, attributes=attributes)


class _Leaf:
    """A span that has no children (a database call): started and ended, never made current, which
    costs less than a current span."""

    __slots__ = ("_span",)

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def __enter__(self) -> trace.Span:
        return self._span

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None and isinstance(exc, Exception):
            self._span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            self._span.set_attribute("error.type", type(exc).__qualname__)
        self._span.end()


def leaf(
    name: str, *, kind: SpanKind = SpanKind.CLIENT, attributes: Attributes | None = None
) -> AbstractContextManager[trace.Span | None]:
    """A child span of the current one that will have none of its own (a Redis or LanceDB call)."""
    if not trace.get_current_span().is_recording():
        return _OFF
    return _Leaf(_tracer.start_span(name, kind=kind, attributes=attributes))


def traced(
    name: str, work: Coroutine[Any, Any, T], attributes: Attributes | None = None
) -> Coroutine[Any, Any, T]:
    """``work`` inside a span of its own (for a task started inside a traced call); ``work`` itself when
    nothing is recorded."""
    if not active():
        return work

    async def run() -> T:
        with _tracer.start_as_current_span(name, attributes=attributes):
            return await work

    return run()


def record(
    name: str, seconds: float, *, kind: SpanKind = SpanKind.CLIENT, attributes: Attributes | None = None
) -> None:
    """A span for what just finished, ``seconds`` long (a call that reports after its reply)."""
    if not trace.get_current_span().is_recording():
        return
    end = time.time_ns()
    done = _tracer.start_span(name, kind=kind, attributes=attributes, start_time=end - int(seconds * 1e9))
    done.end(end_time=end)


def db_attributes(system: str, operation: str) -> dict[str, AttributeValue]:
    return {"db.system.name": system, "db.operation.name": operation}


def redis_call(command: tuple[Any, ...], seconds: float, failed: bool) -> None:
    """A Redis round trip that just finished (``infra/redis_pool.time_commands`` reports each): a CLIENT
    span named for its command, never a key or an argument."""
    if not command or not trace.get_current_span().is_recording():
        return
    first = command[0]
    name = (
        (first.decode(errors="replace") if isinstance(first, bytes) else str(first)).split(" ", 1)[0].upper()
    )
    attributes = db_attributes("redis", name)
    if failed:
        attributes["error.type"] = "redis"
    record(name, seconds, attributes=attributes)


def embedding_span(
    model: str, texts: int, *, remote: bool = False
) -> AbstractContextManager[trace.Span | None]:
    """An embedding call's span: CLIENT when the model runs in the model process (the span is the
    caller's side of that hop), INTERNAL when in this one."""
    if not trace.get_current_span().is_recording():
        return _OFF
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "embeddings",
        "gen_ai.provider.name": PROVIDER,
        "memlane.embedding.texts": texts,
    }
    if model:
        attributes["gen_ai.request.model"] = model
    name = f"embeddings {model}" if model else "embeddings"
    kind = SpanKind.CLIENT if remote else SpanKind.INTERNAL
    return _tracer.start_as_current_span(name, kind=kind, attributes=attributes)


# --- Memory operations (the GenAI memory conventions) --------------------------------------------------


@functools.cache
def capture_content() -> bool:
    """The GenAI content opt-in (read once: the process's environment at its first traced search)."""
    value = os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower()
    return value in ("true", "span_only", "span_and_event")


def memory_attributes(operation: str, **extra: AttributeValue) -> dict[str, AttributeValue]:
    return {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.memory.store.id": LTM_STORE,
        **extra,
    }


@contextlib.contextmanager
def memory_span(operation: str, **extra: AttributeValue) -> Iterator[trace.Span | None]:
    """A memory operation's span (INTERNAL: it runs in this process, inside the RPC's SERVER span)."""
    with span(operation, attributes=memory_attributes(operation, **extra)) as current:
        yield current


# The GenAI retrieval duration, through OpenTelemetry's metrics API: recorded for every search, exported
# where the process has a MeterProvider (an application embedding the sidecar; ``memlane serve`` installs
# none: its metrics are Prometheus', where ``memlane_rpc_duration_seconds`` gives the same).
_retrieval_duration = metrics.get_meter("memlane").create_histogram(
    "gen_ai.retrieval.duration", unit="s", description="GenAI retrieval duration (a memory search)."
)
_RETRIEVAL = {"gen_ai.operation.name": SEARCH, "gen_ai.provider.name": PROVIDER}


@contextlib.contextmanager
def search_span(query: str, top_k: int) -> Iterator[trace.Span | None]:
    """A search's span (and its ``gen_ai.retrieval.duration``); ``found`` adds what it returned."""
    start = time.perf_counter()
    outcome = _RETRIEVAL
    try:
        with memory_span(SEARCH, **{"gen_ai.retrieval.top_k": top_k}) as current:
            if current is not None and capture_content():
                current.set_attribute("gen_ai.memory.query.text", query)
            yield current
    except Exception as exc:
        outcome = {**_RETRIEVAL, "error.type": type(exc).__qualname__}
        raise
    finally:
        _retrieval_duration.record(time.perf_counter() - start, outcome)


def found(current: trace.Span | None, hits: Iterable[tuple[str, float]]) -> None:
    """The records a search returned (id, score): their count; with the content opt-in, the records."""
    if current is None:
        return
    records = list(hits)
    current.set_attribute("gen_ai.memory.record.count", len(records))
    if capture_content():
        current.set_attribute(
            "gen_ai.memory.records", json.dumps([{"id": i, "score": round(s, 6)} for i, s in records])
        )


def wrote(current: trace.Span | None, record_id: str, count: int = 1) -> None:
    if current is not None:
        if record_id:
            current.set_attribute("gen_ai.memory.record.id", record_id)
        current.set_attribute("gen_ai.memory.record.count", count)


# --- Background jobs: a trace of their own, linked to the request that queued them -------------------


def traceparent() -> str:
    """The current span as a W3C ``traceparent`` ("" when none is recorded), for a job to carry."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid or not ctx.trace_flags.sampled:
        return ""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


async def job(
    name: str, queued_by: str, work: Coroutine[Any, Any, T], attributes: Attributes | None = None
) -> T:
    """``work`` inside its job's span (``job_span``)."""
    with job_span(name, queued_by, attributes):
        return await work


def job_span(
    name: str, queued_by: str, attributes: Attributes | None = None
) -> AbstractContextManager[object]:
    """A job's root span (CONSUMER) with a link to ``queued_by`` (a ``traceparent``, "" for none); nothing
    when the SDK is not installed."""
    if isinstance(trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return _OFF
    links = []
    if queued_by:
        origin = trace.get_current_span(
            TraceContextTextMapPropagator().extract({"traceparent": queued_by})
        ).get_span_context()
        if origin.is_valid:
            links.append(Link(origin))
    return _tracer.start_as_current_span(
        name, context=otel_context.Context(), kind=SpanKind.CONSUMER, links=links, attributes=attributes
    )
