"""Admission control: bounded work in flight per RPC kind, the rest shed before latency collapses.

On 2 cores an unbounded sidecar accepts every AssembleContext and serves all of them slowly (a review
measured p99 2.7 s at 32 concurrent clients). Here each RPC method has a gate: at most ``limit`` calls run,
at most ``max_queue`` more wait up to ``max_wait_ms`` for a slot; anything beyond is answered at once with
RESOURCE_EXHAUSTED and a ``retry-after-ms`` trailer (the kind's recent service time), which the client
treats as retryable with backoff. Expensive kinds get small limits of their own, so a flood of assemblies
never takes the slots of cheap calls (GetSession, AppendMessages...) and the gRPC health service is not
gated at all. A server stream holds its slot until it ends, so streams are gated only when named
(AssembleContext, ExportUserData, WatchSessionEvents); the ``*`` default never covers a stream.

Runs as the outermost interceptor: a shed call costs no decoding, authentication or handler work. It
also runs the drain (SIGTERM, ``drain``): new calls are refused with UNAVAILABLE, WatchSessionEvents
streams end at once with UNAVAILABLE (they never end on their own), the calls already admitted get the
grace period to finish, and those still running at its end are answered UNAVAILABLE too. Every one of
those answers carries the reason ``SHUTTING_DOWN``: the client retries, on another sidecar or after the
restart, and what the cut-off call had started is picked up there (a PromoteSession's job goes back to
the queue; writes are idempotent by id). None of them is left to the transport's GOAWAY and CANCELLED.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from ..observability.metrics import RpcMetrics
from .interceptor import trailer

log = logging.getLogger("memlane")

DEFAULT_KIND = "*"
# Streams that follow events until the caller hangs up: a drain ends them at its start, rather than wait
# its whole grace for them (the watcher resumes elsewhere from its last event id).
_FOLLOWERS = frozenset({"WatchSessionEvents"})
# How long a call the drain cuts off gets to unwind and send its UNAVAILABLE: a cancelled handler unwinds
# in milliseconds; one that ignores cancellation is left to the gRPC server's stop.
_ANSWER_S = 2.0
_SHUTTING_DOWN = "this sidecar is shutting down; retry (another one)"
_CUT_OFF = "this sidecar is shutting down and its grace period is over; retry (another one)"


def parse_limits(spec: str) -> dict[str, int]:
    """``"AssembleContext=8,SearchMemories=8,*=64"`` -> per-method limits; ``*`` for every other method.
    A limit of 0 leaves that method ungated."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip().isdigit():
            raise ValueError(f"admission_limits: {part!r} is not METHOD=N")
        out[name.strip()] = int(value)
    return out


class Gate:
    """One RPC kind's slots, bounded wait queue and service-time estimate."""

    def __init__(self, limit: int, max_queue: int, max_wait_s: float) -> None:
        self.limit = limit
        self._sem = asyncio.Semaphore(limit)
        self._max_queue = max_queue
        self._max_wait_s = max_wait_s
        self.waiting = 0
        self.service_ms = 50.0  # moving average of the time a call holds its slot

    async def enter(self) -> bool:
        """True with a slot taken; False when the call must be shed."""
        if not self._sem.locked():
            await self._sem.acquire()  # free slot and nobody queued: does not block
            return True
        if self.waiting >= self._max_queue or self._max_wait_s <= 0:
            return False
        self.waiting += 1
        try:
            async with asyncio.timeout(self._max_wait_s):
                await self._sem.acquire()
            return True
        except TimeoutError:
            return False
        finally:
            self.waiting -= 1

    def leave(self, held_s: float) -> None:
        self.service_ms += (held_s * 1000 - self.service_ms) * 0.1
        self._sem.release()

    def retry_after_ms(self) -> int:
        """How long until a slot is likely free: one service time per queued wave, within [20 ms, 5 s]."""
        waves = 1 + self.waiting / max(self.limit, 1)
        return int(min(5000.0, max(20.0, self.service_ms * waves)))


async def _shutting_down(context: grpc.aio.ServicerContext, message: str = _SHUTTING_DOWN) -> None:
    code = grpc.StatusCode.UNAVAILABLE
    await context.abort(code, message, trailing_metadata=trailer(code, message, "SHUTTING_DOWN"))


async def _refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
    await _shutting_down(context)


# Request bytes are not decoded: the call is refused whatever it carries.
_REFUSE = grpc.unary_unary_rpc_method_handler(_refuse, request_deserializer=None, response_serializer=None)


class AdmissionInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, limits: dict[str, int], max_queue: int, max_wait_ms: int, metrics: RpcMetrics) -> None:
        self._limits = limits
        self._max_queue = max_queue
        self._max_wait_s = max_wait_ms / 1000
        self._metrics = metrics
        self.gates: dict[str, Gate] = {}  # one per gated method, built on first use
        self._cache: dict[str, grpc.RpcMethodHandler] = {}
        self.shed = 0  # calls answered RESOURCE_EXHAUSTED so far
        self.draining = False  # set by drain(): new memlane calls are refused
        # The task serving each memlane call (gRPC runs one per call): what a drain waits for, and cuts
        # off at the end of its grace; WatchSessionEvents streams apart, ended at the drain's start.
        self._calls: set[asyncio.Task[Any]] = set()
        self._followers: set[asyncio.Task[Any]] = set()
        self._cut: set[asyncio.Task[Any]] = set()  # cancelled by the drain: answer UNAVAILABLE
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        """Calls being served, WatchSessionEvents streams aside."""
        return len(self._calls)

    def _gate(self, name: str, *, stream: bool) -> Gate | None:
        default = 0 if stream else self._limits.get(DEFAULT_KIND, 0)
        limit = self._limits.get(name, default)
        if limit <= 0:
            return None
        gate = self.gates.get(name)
        if gate is None:
            gate = self.gates[name] = Gate(limit, self._max_queue, self._max_wait_s)
        return gate

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        if self.draining and method.startswith("/memlane."):
            return _REFUSE  # shutting down: UNAVAILABLE sends the client's retry to another sidecar
        cached = self._cache.get(method)
        if cached is not None:
            return cached
        handler = await continuation(handler_call_details)
        if handler is None or not method.startswith("/memlane."):
            return handler  # health, reflection and unknown methods are not gated
        name = method.rsplit("/", 1)[-1]
        gate = self._gate(name, stream=handler.unary_unary is None)
        wrapped = handler
        if handler.unary_unary is not None:  # counted for the drain even when ungated
            wrapped = grpc.unary_unary_rpc_method_handler(
                self._gated(name, gate, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        elif handler.unary_stream is not None:  # tracked for the drain even when ungated
            wrapped = grpc.unary_stream_rpc_method_handler(
                self._gated_stream(name, gate, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        self._cache[method] = wrapped
        return wrapped

    async def _admit(self, name: str, gate: Gate, context: grpc.aio.ServicerContext) -> None:
        """Takes a slot or aborts the call with RESOURCE_EXHAUSTED and a retry hint."""
        start = time.perf_counter()
        if await gate.enter():
            return
        self.shed += 1
        self._metrics.observe(name, "RESOURCE_EXHAUSTED", time.perf_counter() - start)
        hint = gate.retry_after_ms()
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
        message = (
            f"{name}: the server is at its limit of {gate.limit} concurrent calls of this kind; "
            f"retry after {hint} ms"
        )
        await context.abort(
            code, message, trailing_metadata=trailer(code, message, "OVERLOADED", retry_after_ms=hint)
        )

    async def drain(self, timeout_s: float) -> None:
        """Refuses new calls (UNAVAILABLE: the client retries, elsewhere), ends the WatchSessionEvents
        streams, and waits up to ``timeout_s`` for the calls in flight to finish; those still running
        then are cut off with UNAVAILABLE (``SHUTTING_DOWN``, retried). When this returns, every memlane
        call has been answered, so stopping the gRPC server after it cancels none (refusing here, rather
        than stopping the server at once, gives callers a retryable UNAVAILABLE instead of the GOAWAY and
        CANCELLED of a server shutting down)."""
        self.draining = True
        await self._cut_off(self._followers, "watch streams")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        await self._cut_off(self._calls, "calls still running at the end of the grace period")

    async def _cut_off(self, calls: set[asyncio.Task[Any]], what: str) -> None:
        """Cancels the tasks serving ``calls``; each answers UNAVAILABLE as it unwinds (``_was_cut``)."""
        cut = set(calls)
        if not cut:
            return
        log.info("drain: ending %d %s with UNAVAILABLE", len(cut), what)
        self._cut |= cut
        for task in cut:
            task.cancel()
        await asyncio.wait(cut, timeout=_ANSWER_S)

    def _was_cut(self, task: asyncio.Task[Any]) -> bool:
        """On a CancelledError in a call's task: True when the drain cut the call off (the task then
        goes on to answer UNAVAILABLE); any other cancellation (the client hung up) propagates."""
        if task not in self._cut:
            return False
        self._cut.discard(task)
        task.uncancel()
        return True

    def _enter(self, task: asyncio.Task[Any], *, follows: bool = False) -> None:
        if follows:
            self._followers.add(task)
            return
        self._calls.add(task)
        self._idle.clear()

    def _exit(self, task: asyncio.Task[Any]) -> None:
        self._followers.discard(task)
        self._calls.discard(task)
        self._cut.discard(task)
        if not self._calls:
            self._idle.set()

    def _gated(
        self, name: str, gate: Gate | None, inner: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
    ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            task = _current_task()
            self._enter(task)
            try:
                if gate is None:
                    return await inner(request, context)
                await self._admit(name, gate, context)
                held = time.perf_counter()
                try:
                    return await inner(request, context)
                finally:
                    gate.leave(time.perf_counter() - held)
            except asyncio.CancelledError:
                if not self._was_cut(task):
                    raise
                await _shutting_down(context, _CUT_OFF)
            finally:
                self._exit(task)

        return call

    def _gated_stream(
        self,
        name: str,
        gate: Gate | None,
        inner: Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]],
    ) -> Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]:
        follows = name in _FOLLOWERS

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            task = _current_task()
            self._enter(task, follows=follows)
            try:
                if gate is None:
                    async for item in inner(request, context):
                        yield item
                    return
                await self._admit(name, gate, context)
                held = time.perf_counter()
                try:
                    async for item in inner(request, context):
                        yield item
                finally:
                    gate.leave(time.perf_counter() - held)
            except asyncio.CancelledError:
                if not self._was_cut(task):
                    raise
                await _shutting_down(context, _SHUTTING_DOWN if follows else _CUT_OFF)
            finally:
                self._exit(task)

        return stream


def _current_task() -> asyncio.Task[Any]:
    task = asyncio.current_task()
    assert task is not None  # gRPC serves every call in a task of its own
    return task
