"""Admission control: bounded work in flight per RPC kind, the rest shed before latency collapses.

On 2 cores an unbounded sidecar accepts every AssembleContext and serves all of them slowly (a review
measured p99 2.7 s at 32 concurrent clients). Here each RPC method has a gate: at most ``limit`` calls run,
at most ``max_queue`` more wait up to ``max_wait_ms`` for a slot; anything beyond is answered at once with
RESOURCE_EXHAUSTED and a ``retry-after-ms`` trailer (the kind's recent service time), which the client
treats as retryable with backoff. Expensive kinds get small limits of their own, so a flood of assemblies
never takes the slots of cheap calls (GetSession, AppendMessages...) and the gRPC health service is not
gated at all. A server stream holds its slot until it ends, so streams are gated only when named
(AssembleContext, ExportUserData, WatchSessionEvents); the ``*`` default never covers a stream. A
WatchSessionEvents stream lives until its caller hangs up, so a drain does not wait for it.

Runs as the outermost interceptor: a shed call costs no decoding, authentication or handler work. It
also refuses new calls with UNAVAILABLE once the sidecar starts draining (SIGTERM), while the calls
already admitted finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from ..observability.metrics import RpcMetrics
from .status import trailer

DEFAULT_KIND = "*"
# Streams that follow events until the caller hangs up: a drain would wait its whole grace for them.
_FOLLOWERS = frozenset({"WatchSessionEvents"})


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


async def _refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
    code, message = grpc.StatusCode.UNAVAILABLE, "this sidecar is shutting down; retry (another one)"
    await context.abort(code, message, trailing_metadata=trailer(code, message, "SHUTTING_DOWN"))


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
        self.in_flight = 0  # unary calls and named streams being served (what a drain waits for)
        self._idle = asyncio.Event()
        self._idle.set()

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
        elif gate is not None and handler.unary_stream is not None:
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
        """Refuses new calls (UNAVAILABLE: the client retries, elsewhere) and waits up to ``timeout_s``
        for the calls in flight to finish. Refusing here, rather than stopping the gRPC server at once,
        gives late callers a retryable UNAVAILABLE instead of the CANCELLED of a server shutting down."""
        self.draining = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()

    def _enter(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def _exit(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self._idle.set()

    def _gated(
        self, name: str, gate: Gate | None, inner: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
    ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            self._enter()
            try:
                if gate is None:
                    return await inner(request, context)
                await self._admit(name, gate, context)
                held = time.perf_counter()
                try:
                    return await inner(request, context)
                finally:
                    gate.leave(time.perf_counter() - held)
            finally:
                self._exit()

        return call

    def _gated_stream(
        self, name: str, gate: Gate, inner: Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]
    ) -> Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]:
        follows = name in _FOLLOWERS

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            if not follows:
                self._enter()
            try:
                await self._admit(name, gate, context)
                held = time.perf_counter()
                try:
                    async for item in inner(request, context):
                        yield item
                finally:
                    gate.leave(time.perf_counter() - held)
            finally:
                if not follows:
                    self._exit()

        return stream
