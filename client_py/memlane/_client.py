"""``Client`` (blocking) and ``AsyncClient`` (asyncio): one method per RPC, in snake_case.

Each method takes the request message, or its fields as keyword arguments, plus ``timeout`` (seconds;
the call's deadline). Writes get client-side ids when they have none, which makes every call safe to
retry, so UNAVAILABLE is retried with backoff on all of them; other codes raise the typed error at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message as ProtoMessage

from ._errors import from_rpc_error
from ._ids import new_id
from ._retry import RetryPolicy
from .v1 import context_pb2 as cpb
from .v1 import context_pb2_grpc as cpb_grpc
from .v1 import session_service_pb2 as spb
from .v1 import session_service_pb2_grpc as spb_grpc

R = TypeVar("R", bound=ProtoMessage)

DEFAULT_TARGET = "127.0.0.1:50051"
DEFAULT_TIMEOUT = 30.0
AGENT_HEADER = "x-memlane-agent"


def _build(cls: type[R], request: R | None, fields: dict[str, Any]) -> R:
    if request is not None and fields:
        raise TypeError("pass either a request message or keyword fields, not both")
    if request is not None:
        return request
    try:
        return cls(**fields)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{cls.__name__}: {exc}") from None


def _prepare(request: ProtoMessage) -> None:
    """Fills client-side ids so a retried write lands once."""
    if isinstance(request, spb.AppendMessagesRequest):
        for m in request.messages:
            if not m.message_id:
                m.message_id = new_id()
    elif isinstance(request, spb.CreateSessionRequest) and not request.session_id:
        request.session_id = new_id()


def _metadata(token: str | None, agent_id: str | None) -> tuple[tuple[str, str], ...]:
    md: list[tuple[str, str]] = []
    if token:
        md.append(("authorization", f"Bearer {token}"))
    if agent_id:
        md.append((AGENT_HEADER, agent_id))
    return tuple(md)


def _channel_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.enable_retries", 0),  # we retry ourselves, with typed errors and our own policy
    ]


class Client:
    """Blocking client. Use as a context manager or call ``close()``."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        token: str | None = None,
        agent_id: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        max_message_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        opts = _channel_options(max_message_bytes)
        self._channel = (
            grpc.secure_channel(target, credentials, options=opts)
            if credentials
            else grpc.insecure_channel(target, options=opts)
        )
        self._metadata = _metadata(token, agent_id)
        self._timeout = timeout
        self._retry = retry or RetryPolicy()
        self._sessions = spb_grpc.SessionServiceStub(self._channel)
        self._context = cpb_grpc.ContextServiceStub(self._channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _unary(
        self,
        rpc: Callable[..., Any],
        cls: type[R],
        request: R | None,
        fields: dict[str, Any],
        timeout: float | None,
    ) -> Any:
        req = _build(cls, request, fields)
        _prepare(req)
        attempt = 1
        while True:
            try:
                return rpc(req, timeout=timeout or self._timeout, metadata=self._metadata)
            except grpc.RpcError as exc:
                if exc.code() in self._retry.retryable and attempt < self._retry.max_attempts:
                    time.sleep(self._retry.backoff(attempt))
                    attempt += 1
                    continue
                raise from_rpc_error(exc) from None

    def _stream(
        self,
        rpc: Callable[..., Any],
        cls: type[R],
        request: R | None,
        fields: dict[str, Any],
        timeout: float | None,
    ) -> Iterator[Any]:
        req = _build(cls, request, fields)
        try:
            yield from rpc(req, timeout=timeout or self._timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    # --- SessionService
    def create_session(
        self,
        request: spb.CreateSessionRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> spb.CreateSessionResponse:
        return self._unary(self._sessions.CreateSession, spb.CreateSessionRequest, request, fields, timeout)

    def get_session(
        self, request: spb.GetSessionRequest | None = None, /, *, timeout: float | None = None, **fields: Any
    ) -> spb.GetSessionResponse:
        return self._unary(self._sessions.GetSession, spb.GetSessionRequest, request, fields, timeout)

    def list_sessions(
        self,
        request: spb.ListSessionsRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> spb.ListSessionsResponse:
        return self._unary(self._sessions.ListSessions, spb.ListSessionsRequest, request, fields, timeout)

    def update_session(
        self,
        request: spb.UpdateSessionRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> spb.UpdateSessionResponse:
        return self._unary(self._sessions.UpdateSession, spb.UpdateSessionRequest, request, fields, timeout)

    def close_session(
        self,
        request: spb.CloseSessionRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> spb.CloseSessionResponse:
        return self._unary(self._sessions.CloseSession, spb.CloseSessionRequest, request, fields, timeout)

    def append_messages(
        self,
        request: spb.AppendMessagesRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> spb.AppendMessagesResponse:
        return self._unary(self._sessions.AppendMessages, spb.AppendMessagesRequest, request, fields, timeout)

    def list_messages(
        self,
        request: spb.ListMessagesRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> spb.ListMessagesResponse:
        return self._unary(self._sessions.ListMessages, spb.ListMessagesRequest, request, fields, timeout)

    # --- ContextService
    def assemble_context(
        self,
        request: cpb.AssembleContextRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> Iterator[cpb.AssembleContextResponse]:
        """Streams one response per block, then one with the stats."""
        return self._stream(
            self._context.AssembleContext, cpb.AssembleContextRequest, request, fields, timeout
        )

    def submit_summary(
        self,
        request: cpb.SubmitSummaryRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> cpb.SubmitSummaryResponse:
        return self._unary(self._context.SubmitSummary, cpb.SubmitSummaryRequest, request, fields, timeout)

    def get_turn_trace(
        self,
        request: cpb.GetTurnTraceRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> cpb.GetTurnTraceResponse:
        return self._unary(self._context.GetTurnTrace, cpb.GetTurnTraceRequest, request, fields, timeout)

    def list_turn_traces(
        self,
        request: cpb.ListTurnTracesRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> cpb.ListTurnTracesResponse:
        return self._unary(self._context.ListTurnTraces, cpb.ListTurnTracesRequest, request, fields, timeout)


class AsyncClient:
    """asyncio client (grpc.aio). Use ``async with`` or ``await close()``."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        token: str | None = None,
        agent_id: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        max_message_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        opts = _channel_options(max_message_bytes)
        self._channel = (
            grpc.aio.secure_channel(target, credentials, options=opts)
            if credentials
            else grpc.aio.insecure_channel(target, options=opts)
        )
        self._metadata = _metadata(token, agent_id)
        self._timeout = timeout
        self._retry = retry or RetryPolicy()
        self._sessions = spb_grpc.SessionServiceStub(self._channel)
        self._context = cpb_grpc.ContextServiceStub(self._channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _unary(
        self,
        rpc: Callable[..., Any],
        cls: type[R],
        request: R | None,
        fields: dict[str, Any],
        timeout: float | None,
    ) -> Any:
        req = _build(cls, request, fields)
        _prepare(req)
        attempt = 1
        while True:
            try:
                return await rpc(req, timeout=timeout or self._timeout, metadata=self._metadata)
            except grpc.RpcError as exc:
                if exc.code() in self._retry.retryable and attempt < self._retry.max_attempts:
                    await asyncio.sleep(self._retry.backoff(attempt))
                    attempt += 1
                    continue
                raise from_rpc_error(exc) from None

    async def _stream(
        self,
        rpc: Callable[..., Any],
        cls: type[R],
        request: R | None,
        fields: dict[str, Any],
        timeout: float | None,
    ) -> AsyncIterator[Any]:
        req = _build(cls, request, fields)
        try:
            async for item in rpc(req, timeout=timeout or self._timeout, metadata=self._metadata):
                yield item
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    # --- SessionService
    async def create_session(
        self,
        request: spb.CreateSessionRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> spb.CreateSessionResponse:
        return await self._unary(
            self._sessions.CreateSession, spb.CreateSessionRequest, request, fields, timeout
        )

    async def get_session(
        self, request: spb.GetSessionRequest | None = None, /, *, timeout: float | None = None, **fields: Any
    ) -> spb.GetSessionResponse:
        return await self._unary(self._sessions.GetSession, spb.GetSessionRequest, request, fields, timeout)

    async def list_sessions(
        self,
        request: spb.ListSessionsRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> spb.ListSessionsResponse:
        return await self._unary(
            self._sessions.ListSessions, spb.ListSessionsRequest, request, fields, timeout
        )

    async def update_session(
        self,
        request: spb.UpdateSessionRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> spb.UpdateSessionResponse:
        return await self._unary(
            self._sessions.UpdateSession, spb.UpdateSessionRequest, request, fields, timeout
        )

    async def close_session(
        self,
        request: spb.CloseSessionRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> spb.CloseSessionResponse:
        return await self._unary(
            self._sessions.CloseSession, spb.CloseSessionRequest, request, fields, timeout
        )

    async def append_messages(
        self,
        request: spb.AppendMessagesRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> spb.AppendMessagesResponse:
        return await self._unary(
            self._sessions.AppendMessages, spb.AppendMessagesRequest, request, fields, timeout
        )

    async def list_messages(
        self,
        request: spb.ListMessagesRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> spb.ListMessagesResponse:
        return await self._unary(
            self._sessions.ListMessages, spb.ListMessagesRequest, request, fields, timeout
        )

    # --- ContextService
    def assemble_context(
        self,
        request: cpb.AssembleContextRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> AsyncIterator[cpb.AssembleContextResponse]:
        """Streams one response per block, then one with the stats (``async for``)."""
        return self._stream(
            self._context.AssembleContext, cpb.AssembleContextRequest, request, fields, timeout
        )

    async def submit_summary(
        self,
        request: cpb.SubmitSummaryRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> cpb.SubmitSummaryResponse:
        return await self._unary(
            self._context.SubmitSummary, cpb.SubmitSummaryRequest, request, fields, timeout
        )

    async def get_turn_trace(
        self,
        request: cpb.GetTurnTraceRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> cpb.GetTurnTraceResponse:
        return await self._unary(
            self._context.GetTurnTrace, cpb.GetTurnTraceRequest, request, fields, timeout
        )

    async def list_turn_traces(
        self,
        request: cpb.ListTurnTracesRequest | None = None,
        /,
        *,
        timeout: float | None = None,
        **fields: Any,
    ) -> cpb.ListTurnTracesResponse:
        return await self._unary(
            self._context.ListTurnTraces, cpb.ListTurnTracesRequest, request, fields, timeout
        )


def iter_pages(fetch: Callable[[str], Any], items: str) -> Iterator[Any]:
    """Yields every item of a paginated listing: ``fetch(page_token)`` returns one page."""
    token = ""
    while True:
        page = fetch(token)
        yield from getattr(page, items)
        token = page.next_page_token
        if not token:
            return
