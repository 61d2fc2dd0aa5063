"""The boundary interceptor: every RPC passes through here once.

It maps domain exceptions to gRPC status codes (servicers just raise), records per-RPC latency and
status metrics, turns an undecodable request (e.g. invalid UTF-8 in a string field) into
INVALID_ARGUMENT instead of grpc's generic INTERNAL, as it does a request holding an id outside the
one id grammar (``request_ids``), authenticates the caller and, for a call bound to an end user, holds
the request to that user (``binding.UserBinding``) before any handler runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from .. import errors
from ..access.authenticate import Authenticator, check_method
from ..access.identity import Caller, CallerToken, enter_caller, exit_caller
from ..observability.metrics import RpcMetrics
from ..observability.tracing import RpcSpan, RpcTracing
from .binding import UserBinding
from .request_ids import check_request_ids
from .status import trailer

log = logging.getLogger("memlane.api")

_CODES: tuple[tuple[type[errors.MemlaneError], grpc.StatusCode], ...] = (
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.AlreadyExists, grpc.StatusCode.ALREADY_EXISTS),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),  # also Conflict
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.DataLoss, grpc.StatusCode.DATA_LOSS),
)


class _Undecodable:
    """Stands in for a request whose bytes did not parse, so the handler can answer INVALID_ARGUMENT."""

    def __init__(self, type_name: str, error: str) -> None:
        self.type_name = type_name
        self.error = error


def _safe(deserializer: Callable[[bytes], Any] | None, method: str) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def parse(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except (DecodeError, UnicodeDecodeError, ValueError) as exc:
            return _Undecodable(method.rsplit("/", 1)[-1] + "Request", str(exc))

    return parse


def _passing_bytes(serializer: Callable[[Any], bytes] | None) -> Callable[[Any], bytes] | None:
    """A response serializer that sends a response already encoded (bytes, e.g. assembly's cached
    turns) as it is."""
    if serializer is None:
        return None

    def serialize(response: Any) -> bytes:
        return response if type(response) is bytes else serializer(response)

    return serialize


def _sent_code(context: grpc.aio.ServicerContext) -> str:
    code = context.code()
    return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"


class _Boundary:
    """One RPC's passage through the boundary: the request decoded and the caller authenticated on
    entry (the caller then current for the handler), the outcome counted and any error turned into
    its status on exit."""

    __slots__ = ("_context", "_method", "_name", "_owner", "_request", "_span", "_start", "_token")

    def __init__(self, owner: BoundaryInterceptor, request: Any, context: Any, method: str) -> None:
        self._owner, self._request, self._context = owner, request, context
        self._method, self._name = method, method.rsplit("/", 1)[-1]
        self._token: CallerToken | None = None
        self._span: RpcSpan | None = None

    async def __aenter__(self) -> None:
        self._start = time.perf_counter()
        # Before any check, so refused calls show in the caller's trace too (tracing off: None at once).
        self._span = self._owner._tracing.start(self._method, self._context.invocation_metadata())
        try:
            self._owner._check(self._request)
            caller = self._owner._caller(self._context, self._name)
            await self._owner._binding.check(self._request, caller)
            self._token = enter_caller(caller)
        except Exception as exc:
            await self.__aexit__(type(exc), exc, None)

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        if self._token is not None:
            exit_caller(self._token)
            self._token = None
        elapsed = time.perf_counter() - self._start
        if exc is None:
            self._done("OK", elapsed)
        elif isinstance(exc, grpc.aio.AbortError):
            self._done(_sent_code(self._context), elapsed)
        elif not isinstance(exc, Exception):
            self._done("CANCELLED", elapsed)  # the client went away
        else:
            status, message, details = self._owner._status_for(exc, self._name)
            self._done(status.name, elapsed)
            # raises AbortError in place of ``exc``
            await self._context.abort(status, message, trailing_metadata=details)

    def _done(self, code: str, elapsed: float) -> None:
        self._owner._metrics.observe(self._name, code, elapsed)
        if self._span is not None:
            self._span.end(code)
            self._span = None


class BoundaryInterceptor(grpc.aio.ServerInterceptor):
    def __init__(
        self,
        metrics: RpcMetrics,
        authenticator: Authenticator,
        binding: UserBinding,
        backend_fault: Callable[[BaseException], errors.MemlaneError | None] | None = None,
    ) -> None:
        self._metrics = metrics
        self._auth = authenticator
        self._binding = binding
        # What a backing store's own error means (infra/redis_pool.backend_fault): UNAVAILABLE for a
        # Redis not reachable, RESOURCE_EXHAUSTED for one out of disk, each with a retry hint.
        self._backend_fault = backend_fault
        self._tracing = RpcTracing()  # the global provider: the SDK's when OTEL_* turned tracing on
        self._cache: dict[str, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        cached = self._cache.get(method)
        if cached is not None:
            return cached
        handler = await continuation(handler_call_details)
        if handler is None or not method.startswith("/memlane."):
            return handler  # health, reflection and unknown methods pass through untouched
        wrapped = self._wrap(method, handler)
        self._cache[method] = wrapped
        return wrapped

    def _wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        deser = _safe(handler.request_deserializer, method)
        ser = _passing_bytes(handler.response_serializer)
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                async with _Boundary(self, request, context, method):
                    remaining = context.time_remaining()
                    if remaining is None:
                        return await inner(request, context)
                    async with asyncio.timeout(remaining):
                        return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary, request_deserializer=deser, response_serializer=ser
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                async with _Boundary(self, request, context, method):
                    async for item in inner_stream(request, context):
                        yield item

            return grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=deser, response_serializer=ser
            )
        return handler

    def _caller(self, context: Any, name: str) -> Caller:
        caller = self._auth.authenticate(
            context.invocation_metadata() or (), context.peer(), context.auth_context()
        )
        check_method(caller, name)
        return caller

    @staticmethod
    def _check(request: Any) -> None:
        if isinstance(request, _Undecodable):
            raise errors.InvalidArgument(
                f"request is not a valid memlane.v1.{request.type_name} "
                f"(string fields must be UTF-8): {request.error}",
                reason="MALFORMED_REQUEST",
            )
        check_request_ids(request)  # one id grammar for every RPC

    def _status_for(
        self, exc: BaseException, name: str
    ) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str | bytes], ...]]:
        if self._backend_fault is not None and (fault := self._backend_fault(exc)) is not None:
            log.warning("backing store failed", extra={"rpc": name, "error": repr(exc)[:300]})
            exc = fault
        for kind, code in _CODES:
            if isinstance(exc, kind):
                message = str(exc)
                details = trailer(
                    code, message, exc.reason, field=exc.field, retry_after_ms=exc.retry_after_ms
                )
                return code, message, details
        if isinstance(exc, TimeoutError):
            code, message = (
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{name} did not finish before the call's deadline",
            )
            return code, message, trailer(code, message, "DEADLINE_EXCEEDED")
        ref = uuid.uuid4().hex[:12]
        log.exception("unhandled error", extra={"rpc": name, "ref": ref})
        code, message = (
            grpc.StatusCode.INTERNAL,
            f"internal error (ref {ref}); the server log has the details",
        )
        return code, message, trailer(code, message, "INTERNAL", info={"ref": ref})
