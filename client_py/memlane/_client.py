"""``Client`` (blocking) and ``AsyncClient`` (asyncio): one method per RPC, in snake_case.

Each method takes the request message, or its fields as keyword arguments, plus ``timeout`` (seconds;
the call's deadline). Writes get client-side ids when they have none (messages, sessions, feedback),
which makes them safe to retry, so UNAVAILABLE is retried with backoff on unary calls (and on a stream
before its first item); the two writes that cannot be made so without the caller's id are sent once
(see ``_prepare``). Other codes raise the typed error at once. ``grpc.RpcError`` never escapes.

The RPCs are declared once, in ``_Rpcs``, as descriptors; both clients inherit them and supply the
transport (blocking or asyncio), so the two can never drift apart.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

import grpc
from google.protobuf.message import Message as ProtoMessage

from ._errors import from_rpc_error
from ._ids import new_id
from ._retry import RetryPolicy, retry_hint
from ._tracing import CallSpan, Metadata, trace_metadata
from .v1 import admin_pb2 as apb
from .v1 import admin_pb2_grpc as apb_grpc
from .v1 import checkpoint_pb2 as kpb
from .v1 import checkpoint_pb2_grpc as kpb_grpc
from .v1 import context_pb2 as cpb
from .v1 import context_pb2_grpc as cpb_grpc
from .v1 import memory_pb2 as mpb
from .v1 import memory_pb2_grpc as mpb_grpc
from .v1 import procedure_pb2 as ppb
from .v1 import procedure_pb2_grpc as ppb_grpc
from .v1 import session_service_pb2 as spb
from .v1 import session_service_pb2_grpc as spb_grpc

Req = TypeVar("Req", bound=ProtoMessage)
Resp = TypeVar("Resp", bound=ProtoMessage)
Req_contra = TypeVar("Req_contra", bound=ProtoMessage, contravariant=True)
Resp_co = TypeVar("Resp_co", bound=ProtoMessage, covariant=True)

DEFAULT_TARGET = "127.0.0.1:50051"


def address_from_env() -> str:
    """The sidecar's address as the environment names it ($MEMLANE_ADDRESS, or the older
    $MEMLANE_TARGET), else ``DEFAULT_TARGET``: what every command line defaults to."""
    return os.environ.get("MEMLANE_ADDRESS") or os.environ.get("MEMLANE_TARGET") or DEFAULT_TARGET


DEFAULT_TIMEOUT = 30.0
AGENT_HEADER = "x-memlane-agent"
USER_TOKEN_HEADER = "x-memlane-user-token"  # a signed end-user token (JWT), when the sidecar binds users

# The full service names (as the sidecar's spans name them).
_SERVICES = {
    "sessions": "memlane.v1.SessionService",
    "context": "memlane.v1.ContextService",
    "memory": "memlane.v1.MemoryService",
    "admin": "memlane.v1.AdminService",
    "checkpoints": "memlane.v1.CheckpointService",
    "procedures": "memlane.v1.ProcedureService",
}
_STUBS: dict[str, Callable[[Any], Any]] = {
    "sessions": spb_grpc.SessionServiceStub,
    "context": cpb_grpc.ContextServiceStub,
    "memory": mpb_grpc.MemoryServiceStub,
    "admin": apb_grpc.AdminServiceStub,
    "checkpoints": kpb_grpc.CheckpointServiceStub,
    "procedures": ppb_grpc.ProcedureServiceStub,
}


def _build(cls: type[Req], request: Req | None, fields: dict[str, Any]) -> Req:
    if request is not None and fields:
        raise TypeError("pass either a request message or keyword fields, not both")
    if request is not None:
        return request
    try:
        return cls(**fields)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{cls.__name__}: {exc}") from None


def _prepare(request: ProtoMessage) -> bool:
    """Fills client-side ids so a retried write lands once; returns whether the call is safe to retry.
    Two writes are not without an id of the caller's: CreateMemory without ``memory_id`` (a retry could
    store a second item) and ExtractMemories outside ``dry_run`` (a retry merges the same items again)."""
    if isinstance(request, mpb.CreateMemoryRequest):
        return bool(request.memory_id)
    if isinstance(request, mpb.ExtractMemoriesRequest):
        return request.dry_run
    if isinstance(request, spb.AppendMessagesRequest):
        for m in request.messages:
            if not m.message_id:
                m.message_id = new_id()
    elif isinstance(request, spb.CreateSessionRequest) and not request.session_id:
        request.session_id = new_id()
    elif isinstance(request, mpb.RecordFeedbackRequest) and not request.feedback_id:
        request.feedback_id = new_id()  # the server counts one piece of feedback once
    elif isinstance(request, spb.RemoveMessagesRequest) and not request.request_id:
        request.request_id = new_id()
    return True


def _metadata(token: str | None, agent_id: str | None, user_token: str | None) -> Metadata:
    md: list[tuple[str, str]] = []
    if token:
        md.append(("authorization", f"Bearer {token}"))
    if agent_id:
        md.append((AGENT_HEADER, agent_id))
    if user_token:
        md.append((USER_TOKEN_HEADER, user_token))
    return tuple(md)


def _channel_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.enable_retries", 0),  # we retry ourselves, with typed errors and our own policy
    ]


# ------------------------------------------------------------------------------------ method shapes


class _SyncUnary(Protocol[Req_contra, Resp_co]):
    def __call__(
        self, request: Req_contra | None = None, /, *, timeout: float | None = None, **fields: Any
    ) -> Resp_co: ...


class _AsyncUnary(Protocol[Req_contra, Resp_co]):
    def __call__(
        self, request: Req_contra | None = None, /, *, timeout: float | None = None, **fields: Any
    ) -> Awaitable[Resp_co]: ...


class _SyncStream(Protocol[Req_contra, Resp_co]):
    def __call__(
        self, request: Req_contra | None = None, /, *, timeout: float | None = None, **fields: Any
    ) -> Iterator[Resp_co]: ...


class _AsyncStream(Protocol[Req_contra, Resp_co]):
    def __call__(
        self, request: Req_contra | None = None, /, *, timeout: float | None = None, **fields: Any
    ) -> AsyncIterator[Resp_co]: ...


class _Rpc(Generic[Req, Resp]):
    """Declares one RPC of a service; subclasses say whether it is unary or server-streaming."""

    def __init__(self, service: str, method: str, request: type[Req], response: type[Resp]) -> None:
        self.service, self.method, self.request = service, method, request

    def _bind(self, send: Callable[[Any, ProtoMessage, float | None], Any]) -> Callable[..., Any]:
        spec = self

        def call(request: Req | None = None, /, *, timeout: float | None = None, **fields: Any) -> Any:
            return send(spec, _build(spec.request, request, fields), timeout)

        return call


class _Unary(_Rpc[Req, Resp]):
    @overload
    def __get__(self, obj: None, owner: type) -> _Unary[Req, Resp]: ...
    @overload
    def __get__(self, obj: Client, owner: type) -> _SyncUnary[Req, Resp]: ...
    @overload
    def __get__(self, obj: AsyncClient, owner: type) -> _AsyncUnary[Req, Resp]: ...
    def __get__(self, obj: _Transport | None, owner: type) -> Any:
        return self if obj is None else self._bind(obj._unary)


class _Stream(_Rpc[Req, Resp]):
    @overload
    def __get__(self, obj: None, owner: type) -> _Stream[Req, Resp]: ...
    @overload
    def __get__(self, obj: Client, owner: type) -> _SyncStream[Req, Resp]: ...
    @overload
    def __get__(self, obj: AsyncClient, owner: type) -> _AsyncStream[Req, Resp]: ...
    def __get__(self, obj: _Transport | None, owner: type) -> Any:
        return self if obj is None else self._bind(obj._stream)


class _Rpcs:
    """Every RPC of memlane.v1, once. Docs: the comments in protos/memlane/v1/*.proto."""

    # SessionService
    create_session = _Unary("sessions", "CreateSession", spb.CreateSessionRequest, spb.CreateSessionResponse)
    get_session = _Unary("sessions", "GetSession", spb.GetSessionRequest, spb.GetSessionResponse)
    list_sessions = _Unary("sessions", "ListSessions", spb.ListSessionsRequest, spb.ListSessionsResponse)
    update_session = _Unary("sessions", "UpdateSession", spb.UpdateSessionRequest, spb.UpdateSessionResponse)
    close_session = _Unary("sessions", "CloseSession", spb.CloseSessionRequest, spb.CloseSessionResponse)
    append_messages = _Unary(
        "sessions", "AppendMessages", spb.AppendMessagesRequest, spb.AppendMessagesResponse
    )
    list_messages = _Unary("sessions", "ListMessages", spb.ListMessagesRequest, spb.ListMessagesResponse)
    remove_messages = _Unary(
        "sessions", "RemoveMessages", spb.RemoveMessagesRequest, spb.RemoveMessagesResponse
    )
    update_message = _Unary("sessions", "UpdateMessage", spb.UpdateMessageRequest, spb.UpdateMessageResponse)
    promote_session = _Unary(
        "sessions", "PromoteSession", spb.PromoteSessionRequest, spb.PromoteSessionResponse
    )
    watch_session_events = _Stream(
        "sessions", "WatchSessionEvents", spb.WatchSessionEventsRequest, spb.WatchSessionEventsResponse
    )
    # ContextService
    assemble_context = _Stream(
        "context", "AssembleContext", cpb.AssembleContextRequest, cpb.AssembleContextResponse
    )
    submit_summary = _Unary("context", "SubmitSummary", cpb.SubmitSummaryRequest, cpb.SubmitSummaryResponse)
    get_turn_trace = _Unary("context", "GetTurnTrace", cpb.GetTurnTraceRequest, cpb.GetTurnTraceResponse)
    list_turn_traces = _Unary(
        "context", "ListTurnTraces", cpb.ListTurnTracesRequest, cpb.ListTurnTracesResponse
    )
    # MemoryService
    search_memories = _Unary(
        "memory", "SearchMemories", mpb.SearchMemoriesRequest, mpb.SearchMemoriesResponse
    )
    get_profile = _Unary("memory", "GetProfile", mpb.GetProfileRequest, mpb.GetProfileResponse)
    create_memory = _Unary("memory", "CreateMemory", mpb.CreateMemoryRequest, mpb.CreateMemoryResponse)
    get_memory = _Unary("memory", "GetMemory", mpb.GetMemoryRequest, mpb.GetMemoryResponse)
    list_memories = _Unary("memory", "ListMemories", mpb.ListMemoriesRequest, mpb.ListMemoriesResponse)
    update_memory = _Unary("memory", "UpdateMemory", mpb.UpdateMemoryRequest, mpb.UpdateMemoryResponse)
    delete_memory = _Unary("memory", "DeleteMemory", mpb.DeleteMemoryRequest, mpb.DeleteMemoryResponse)
    record_feedback = _Unary(
        "memory", "RecordFeedback", mpb.RecordFeedbackRequest, mpb.RecordFeedbackResponse
    )
    extract_memories = _Unary(
        "memory", "ExtractMemories", mpb.ExtractMemoriesRequest, mpb.ExtractMemoriesResponse
    )
    merge_memories = _Unary("memory", "MergeMemories", mpb.MergeMemoriesRequest, mpb.MergeMemoriesResponse)
    # MemoryService: versions and snapshots
    list_memory_versions = _Unary(
        "memory", "ListMemoryVersions", mpb.ListMemoryVersionsRequest, mpb.ListMemoryVersionsResponse
    )
    create_memory_snapshot = _Unary(
        "memory", "CreateMemorySnapshot", mpb.CreateMemorySnapshotRequest, mpb.CreateMemorySnapshotResponse
    )
    list_memory_snapshots = _Unary(
        "memory", "ListMemorySnapshots", mpb.ListMemorySnapshotsRequest, mpb.ListMemorySnapshotsResponse
    )
    get_memory_snapshot_diff = _Unary(
        "memory",
        "GetMemorySnapshotDiff",
        mpb.GetMemorySnapshotDiffRequest,
        mpb.GetMemorySnapshotDiffResponse,
    )
    restore_memory_snapshot = _Unary(
        "memory",
        "RestoreMemorySnapshot",
        mpb.RestoreMemorySnapshotRequest,
        mpb.RestoreMemorySnapshotResponse,
    )
    delete_memory_snapshot = _Unary(
        "memory", "DeleteMemorySnapshot", mpb.DeleteMemorySnapshotRequest, mpb.DeleteMemorySnapshotResponse
    )
    # ProcedureService
    propose_procedure = _Unary(
        "procedures", "ProposeProcedure", ppb.ProposeProcedureRequest, ppb.ProposeProcedureResponse
    )
    list_procedures = _Unary(
        "procedures", "ListProcedures", ppb.ListProceduresRequest, ppb.ListProceduresResponse
    )
    get_procedure = _Unary("procedures", "GetProcedure", ppb.GetProcedureRequest, ppb.GetProcedureResponse)
    approve_procedure = _Unary(
        "procedures", "ApproveProcedure", ppb.ApproveProcedureRequest, ppb.ApproveProcedureResponse
    )
    reject_procedure = _Unary(
        "procedures", "RejectProcedure", ppb.RejectProcedureRequest, ppb.RejectProcedureResponse
    )
    roll_back_procedure = _Unary(
        "procedures", "RollBackProcedure", ppb.RollBackProcedureRequest, ppb.RollBackProcedureResponse
    )
    embed = _Unary("memory", "Embed", mpb.EmbedRequest, mpb.EmbedResponse)
    # AdminService
    export_user_data = _Stream(
        "admin", "ExportUserData", apb.ExportUserDataRequest, apb.ExportUserDataResponse
    )
    forget_user = _Unary("admin", "ForgetUser", apb.ForgetUserRequest, apb.ForgetUserResponse)
    list_parked_jobs = _Unary(
        "admin", "ListParkedJobs", apb.ListParkedJobsRequest, apb.ListParkedJobsResponse
    )
    retry_parked_jobs = _Unary(
        "admin", "RetryParkedJobs", apb.RetryParkedJobsRequest, apb.RetryParkedJobsResponse
    )
    list_users = _Unary("admin", "ListUsers", apb.ListUsersRequest, apb.ListUsersResponse)
    import_user_data = _Unary(
        "admin", "ImportUserData", apb.ImportUserDataRequest, apb.ImportUserDataResponse
    )
    # CheckpointService
    put_checkpoint = _Unary(
        "checkpoints", "PutCheckpoint", kpb.PutCheckpointRequest, kpb.PutCheckpointResponse
    )
    put_checkpoint_writes = _Unary(
        "checkpoints", "PutCheckpointWrites", kpb.PutCheckpointWritesRequest, kpb.PutCheckpointWritesResponse
    )
    get_checkpoint = _Unary(
        "checkpoints", "GetCheckpoint", kpb.GetCheckpointRequest, kpb.GetCheckpointResponse
    )
    list_checkpoints = _Unary(
        "checkpoints", "ListCheckpoints", kpb.ListCheckpointsRequest, kpb.ListCheckpointsResponse
    )
    delete_checkpoints = _Unary(
        "checkpoints", "DeleteCheckpoints", kpb.DeleteCheckpointsRequest, kpb.DeleteCheckpointsResponse
    )
    copy_checkpoints = _Unary(
        "checkpoints", "CopyCheckpoints", kpb.CopyCheckpointsRequest, kpb.CopyCheckpointsResponse
    )
    prune_checkpoints = _Unary(
        "checkpoints", "PruneCheckpoints", kpb.PruneCheckpointsRequest, kpb.PruneCheckpointsResponse
    )
    delete_checkpoint_runs = _Unary(
        "checkpoints",
        "DeleteCheckpointRuns",
        kpb.DeleteCheckpointRunsRequest,
        kpb.DeleteCheckpointRunsResponse,
    )


class _Transport:
    """What the descriptors need of a client: a channel's stubs, credentials, deadline and retries."""

    def __init__(
        self,
        channel: Any,
        token: str | None,
        agent_id: str | None,
        timeout: float,
        retry: RetryPolicy | None,
        *,
        user_token: str | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        propagate_trace: bool = True,
    ) -> None:
        self._channel = channel
        self._metadata = _metadata(token, agent_id, user_token) + tuple(metadata)
        self._propagate_trace = propagate_trace
        self._timeout = timeout
        self._retry = retry or RetryPolicy()
        self._stubs = {name: make(channel) for name, make in _STUBS.items()}

    def _rpc(self, spec: _Rpc[Any, Any]) -> Callable[..., Any]:
        return getattr(self._stubs[spec.service], spec.method)

    def _call_metadata(self, call: CallSpan | None = None) -> Metadata:
        """This client's metadata and, read at each call, the trace context: the call's own CLIENT span
        when one is recorded, else the caller's active span."""
        return self._metadata + trace_metadata(call) if self._propagate_trace else self._metadata

    def _span(self, spec: _Rpc[Any, Any]) -> CallSpan:
        return CallSpan(_SERVICES[spec.service], spec.method)

    def _retry_delay(
        self, exc: grpc.RpcError, attempt: int, *, started: bool = False, safe: bool = True
    ) -> float:
        """Seconds to wait before attempt ``attempt + 1``; raises the typed error when it is final.
        A stream is only retried before its first item (a partial stream cannot be resumed); a write
        that is not safe to repeat (see ``_prepare``) is never retried."""
        if safe and not started and attempt < self._retry.max_attempts:
            if exc.code() in self._retry.retryable:
                return self._retry.backoff(attempt)
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and (hint := retry_hint(exc)) > 0:
                return self._retry.backoff(attempt, hint)  # shed under load: come back when told
        raise from_rpc_error(exc) from None

    def _unary(self, spec: _Unary[Any, Any], request: ProtoMessage, timeout: float | None) -> Any:
        raise NotImplementedError

    def _stream(self, spec: _Stream[Any, Any], request: ProtoMessage, timeout: float | None) -> Any:
        raise NotImplementedError


if TYPE_CHECKING:  # the same RPCs with every keyword field typed (generated: scripts/gen_client_types.py)
    from .v1.rpcs import AsyncRpcs as _AsyncRpcs
    from .v1.rpcs import SyncRpcs as _SyncRpcs
else:
    _SyncRpcs = _AsyncRpcs = _Rpcs


class Client(_Transport, _SyncRpcs):
    """Blocking client. Use as a context manager or call ``close()``.

    ``metadata``: extra (key, value) pairs sent with every call. ``interceptors``: ``grpc`` client
    interceptors the channel runs on every call and retry (logging, your own tracing). When OpenTelemetry's
    API is installed and a span is active, each call carries it (``traceparent``) so the sidecar's spans
    join the caller's trace; ``propagate_trace=False`` turns that off."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        token: str | None = None,
        agent_id: str | None = None,
        user_token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        max_message_bytes: int = 16 * 1024 * 1024,
        metadata: Sequence[tuple[str, str]] = (),
        interceptors: Sequence[Any] = (),
        propagate_trace: bool = True,
    ) -> None:
        opts = _channel_options(max_message_bytes)
        channel = (
            grpc.secure_channel(target, credentials, options=opts)
            if credentials
            else grpc.insecure_channel(target, options=opts)
        )
        if interceptors:
            channel = grpc.intercept_channel(channel, *interceptors)
        super().__init__(
            channel,
            token,
            agent_id,
            timeout,
            retry,
            user_token=user_token,
            metadata=metadata,
            propagate_trace=propagate_trace,
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _unary(self, spec: _Unary[Any, Any], request: ProtoMessage, timeout: float | None) -> Any:
        safe = _prepare(request)
        rpc = self._rpc(spec)
        attempt = 1
        span = self._span(spec)
        try:
            while True:
                try:
                    response = rpc(
                        request, timeout=timeout or self._timeout, metadata=self._call_metadata(span)
                    )
                    span.answered(response)
                    break
                except grpc.RpcError as exc:
                    time.sleep(self._retry_delay(exc, attempt, safe=safe))
                    attempt += 1
        except BaseException as exc:
            span.end(exc)
            raise
        span.end()
        return response

    def _stream(self, spec: _Stream[Any, Any], request: ProtoMessage, timeout: float | None) -> Iterator[Any]:
        rpc = self._rpc(spec)
        attempt = 1
        span = self._span(spec)
        try:
            while True:
                started = False
                call = rpc(request, timeout=timeout or self._timeout, metadata=self._call_metadata(span))
                try:
                    for item in call:
                        started = True
                        yield item
                    break
                except grpc.RpcError as exc:
                    time.sleep(self._retry_delay(exc, attempt, started=started))
                    attempt += 1
                finally:
                    call.cancel()  # a consumer that stops early must not leave the stream open server-side
        except BaseException as exc:
            span.end(exc)
            raise
        span.end()


class AsyncClient(_Transport, _AsyncRpcs):
    """asyncio client (grpc.aio). Use ``async with`` or ``await close()``. ``metadata``, ``interceptors``
    (``grpc.aio`` client interceptors) and ``propagate_trace``: as for ``Client``."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        token: str | None = None,
        agent_id: str | None = None,
        user_token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        max_message_bytes: int = 16 * 1024 * 1024,
        metadata: Sequence[tuple[str, str]] = (),
        interceptors: Sequence[Any] = (),
        propagate_trace: bool = True,
    ) -> None:
        opts = _channel_options(max_message_bytes)
        channel = (
            grpc.aio.secure_channel(target, credentials, options=opts, interceptors=interceptors or None)
            if credentials
            else grpc.aio.insecure_channel(target, options=opts, interceptors=interceptors or None)
        )
        super().__init__(
            channel,
            token,
            agent_id,
            timeout,
            retry,
            user_token=user_token,
            metadata=metadata,
            propagate_trace=propagate_trace,
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _unary(self, spec: _Unary[Any, Any], request: ProtoMessage, timeout: float | None) -> Any:
        safe = _prepare(request)
        rpc = self._rpc(spec)
        attempt = 1
        span = self._span(spec)
        try:
            while True:
                try:
                    metadata = self._call_metadata(span)
                    response = await rpc(request, timeout=timeout or self._timeout, metadata=metadata)
                    span.answered(response)
                    break
                except grpc.RpcError as exc:
                    await asyncio.sleep(self._retry_delay(exc, attempt, safe=safe))
                    attempt += 1
        except BaseException as exc:
            span.end(exc)
            raise
        span.end()
        return response

    async def _stream(
        self, spec: _Stream[Any, Any], request: ProtoMessage, timeout: float | None
    ) -> AsyncIterator[Any]:
        rpc = self._rpc(spec)
        attempt = 1
        span = self._span(spec)
        try:
            while True:
                started = False
                call = rpc(request, timeout=timeout or self._timeout, metadata=self._call_metadata(span))
                try:
                    async for item in call:
                        started = True
                        yield item
                    break
                except grpc.RpcError as exc:
                    await asyncio.sleep(self._retry_delay(exc, attempt, started=started))
                    attempt += 1
                finally:
                    call.cancel()  # a consumer that stops early must not leave the stream open server-side
        except BaseException as exc:
            span.end(exc)
            raise
        span.end()


def iter_pages(fetch: Callable[[str], Any], items: str) -> Iterator[Any]:
    """Yields every item of a paginated listing: ``fetch(page_token)`` returns one page."""
    token = ""
    while True:
        page = fetch(token)
        yield from getattr(page, items)
        token = page.next_page_token
        if not token:
            return
