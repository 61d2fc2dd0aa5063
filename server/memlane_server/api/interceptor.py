"""The boundary interceptor: every RPC passes through here once.

It maps domain exceptions to gRPC status codes (servicers just raise), records per-RPC latency and
status metrics, turns an undecodable request (e.g. invalid UTF-8 in a string field) into
INVALID_ARGUMENT instead of grpc's generic INTERNAL, as it does a request holding an id outside the
one id grammar (``check_request_ids``), authenticates the caller and, for a call bound to an end user,
holds the request to that user (``UserBinding``) before any handler runs. What the boundary needs for
that lives here too, each in its section: the structured error trailer, the id check, the user binding.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError, Message
from google.rpc.error_details_pb2 import BadRequest, ErrorInfo, RetryInfo
from google.rpc.status_pb2 import Status

from .. import errors
from ..access.authenticate import Authenticator, check_method
from ..access.identity import Caller, CallerToken, enter_caller, exit_caller
from ..errors import NotFound, PermissionDenied
from ..ids import check_id, normalized
from ..observability.metrics import RpcMetrics
from ..observability.tracing import RpcSpan, RpcTracing
from ..sessions.store import SessionStore

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


class DurableStore(Protocol):
    """A store whose persistence the sidecar vouches for (its embedded Redis: infra/redis_server.
    DurableWrites), asked around every unary RPC that may write (``_writes``), so that a call answered
    OK is on disk and a full disk answers STORAGE_FULL."""

    def check_room(self) -> None:
        """Raises before the handler runs while the store is known to have no room."""

    async def confirm_written(self) -> None:
        """Raises after the handler when a write it made did not reach the disk."""


# RPCs that only read (by the verb their name starts with): answered without asking whether the store
# persisted anything. Every other unary RPC may write.
_READ_VERBS = ("Get", "List", "Search", "Export", "Watch", "Embed")


def _writes(method: str) -> bool:
    return not method.rsplit("/", 1)[-1].startswith(_READ_VERBS)


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
        durable: DurableStore | None = None,
    ) -> None:
        self._metrics = metrics
        self._durable = durable
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
            durable = self._durable if _writes(method) else None

            async def answered(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if durable is None:
                    return await inner(request, context)
                durable.check_room()
                response = await inner(request, context)
                await durable.confirm_written()
                return response

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                async with _Boundary(self, request, context, method):
                    remaining = context.time_remaining()
                    if remaining is None:
                        return await answered(request, context)
                    async with asyncio.timeout(remaining):
                        return await answered(request, context)

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
        # A domain error says what it is, even one that is also an OSError (EmbeddingUnavailable).
        fault = (
            None
            if isinstance(exc, errors.MemlaneError) or self._backend_fault is None
            else self._backend_fault(exc)
        )
        if fault is not None:
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


# --- The error trailer ----------------------------------------------------------------------------------
# The structured part of a failed call: a ``google.rpc.Status`` in the ``grpc-status-details-bin``
# trailer, as gRPC's rich error model defines it. Programs read the field at fault (``BadRequest``), a
# stable reason (``ErrorInfo``) and when to retry (``RetryInfo``) instead of parsing the message.

DETAILS_KEY = "grpc-status-details-bin"
DOMAIN = "memlane.dev"
RETRY_AFTER_KEY = "retry-after-ms"  # also as plain metadata, for clients without the details


def trailer(
    code: grpc.StatusCode,
    message: str,
    reason: str,
    *,
    field: str = "",
    retry_after_ms: int | None = None,
    info: dict[str, str] | None = None,
) -> tuple[tuple[str, str | bytes], ...]:
    """Trailing metadata for ``context.abort(code, message, trailing_metadata=...)``."""
    status = Status(code=code.value[0], message=message)
    if field:
        violation = BadRequest.FieldViolation(field=field, description=message)
        status.details.add().Pack(BadRequest(field_violations=[violation]))
    status.details.add().Pack(ErrorInfo(reason=reason, domain=DOMAIN, metadata=info or {}))
    out: list[tuple[str, str | bytes]] = []
    if retry_after_ms is not None:
        delay = Duration()
        delay.FromMilliseconds(retry_after_ms)
        status.details.add().Pack(RetryInfo(retry_delay=delay))
        out.append((RETRY_AFTER_KEY, str(retry_after_ms)))
    out.append((DETAILS_KEY, status.SerializeToString()))
    return tuple(out)


# --- Request ids -----------------------------------------------------------------------------------------
# Every id in every request, put in NFC and checked against the one id grammar
# (``memlane_server.ids``) before any handler runs. Ids are recognised by field name, in nested messages
# too (``messages[3].source_agent_id``), so a new RPC is covered the day it is added; an empty field is
# left to its handler (required or not).

# Field names that hold ids of users, agents, groups, sessions, channels, memories, messages, traces.
ID_FIELDS = frozenset(
    {
        "user_id",
        "agent_id",
        "session_id",
        "memory_id",
        "message_id",
        "trace_id",
        "source_agent_id",
        "source_session_id",
        "through_message_id",
        "group",
        "visibility_group",
        "channel",
        "groups",
        "participants",
        "message_ids",
        "memory_ids",
        "source_agent_ids",
        "source_message_ids",
        "procedure_id",
        "snapshot_id",
        "backup_snapshot_id",
    }
)


# Fields that share an id's name but hold a framework's own names: a LangGraph channel (``__start__``,
# ``__error__``) is a key inside one checkpoint, never a Redis key, path or predicate; the checkpoint
# store bounds it (``checkpoints.store``).
NOT_IDS = frozenset({"memlane.v1.ChannelValue.channel", "memlane.v1.PendingWrite.channel"})


# What each field is to the check, decided once per field (descriptor lookups cost more than the check).
_SKIP, _MESSAGE, _MESSAGES, _ID, _IDS = range(5)
_KINDS: dict[str, int] = {}


def _kind(field: FieldDescriptor) -> int:
    kind = _KINDS.get(field.full_name)
    if kind is not None:
        return kind
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            kind = _SKIP  # metadata maps hold free text, not ids
        else:
            kind = _MESSAGES if field.is_repeated else _MESSAGE
    elif (
        field.name in ID_FIELDS
        and field.type == FieldDescriptor.TYPE_STRING
        and field.full_name not in NOT_IDS
    ):
        kind = _IDS if field.is_repeated else _ID
    else:
        kind = _SKIP
    _KINDS[field.full_name] = kind
    return kind


def check_request_ids(request: Message, prefix: str = "") -> None:
    """Rewrites every id in NFC (in place: the handler reads the normalized request), and raises
    InvalidArgument naming the first field (as a path) whose id is not valid."""
    for field, value in request.ListFields():
        kind = _kind(field)
        if kind == _SKIP:
            continue
        path = f"{prefix}{field.name}"
        if kind == _MESSAGE:
            check_request_ids(value, f"{path}.")
        elif kind == _MESSAGES:
            for i, item in enumerate(value):
                check_request_ids(item, f"{path}[{i}].")
        elif kind == _IDS:
            for i, item in enumerate(value):
                if (nfc := normalized(item)) != item:
                    value[i] = nfc
                check_id(nfc, f"{path}[{i}]")
        else:
            if (nfc := normalized(value)) != value:
                setattr(request, field.name, nfc)
            check_id(nfc, path, required=False)


# --- User binding ----------------------------------------------------------------------------------------
# Holds a call bound to an end user (a verified user token) to that user's data, for every RPC.
#
# Every memlane request names its user in one of four ways, and this is the one place that reads them:
#
# - ``user_id`` (CreateSession, ListSessions, WatchSessionEvents, ExportUserData, ForgetUser),
# - ``caller.user_id`` (every MemoryService RPC),
# - ``session_id`` (the session's RPCs, the context RPCs, ExtractMemories' source session),
# - ``session.session_id`` (UpdateSession).
#
# An empty user field is filled with the bound user, so a bound ListSessions or WatchSessionEvents lists
# or follows that user only; a different one is refused. A session named by id must belong to the bound
# user (a missing one is left to the handler: NOT_FOUND, or CreateSession making it for this user).
# ``tests/unit/test_user_binding.py`` checks that every RPC's request has one of these fields, so a new
# RPC cannot slip past unbound.

USER_FIELDS = ("user_id", "caller.user_id")
SESSION_FIELDS = (
    "session_id",
    "session.session_id",
    "source_session_id",  # CopyCheckpoints: both threads must be the user's
    "target_session_id",
    "session_ids",  # PruneCheckpoints (repeated)
)
# RPCs that name no user in a request field: operator work on the session-end queue, refused to
# everyone but admins; ListUsers, whose handler narrows a bound call to its user; ImportUserData, whose
# user is named inside the file and held to the binding by its handler.
OPERATOR_RPCS = frozenset(
    f"memlane.v1.AdminService.{name}"
    for name in ("ListParkedJobs", "RetryParkedJobs", "ListUsers", "ImportUserData")
)
# RPCs on an agent's procedural memory (procedure.proto): they name no user because procedures are the
# agent's, not a user's. A version learned from a session names it (``source_session_id``, checked
# here); versions learned from other users' sessions are hidden from a bound call by the API.
AGENT_RPCS = frozenset(
    f"memlane.v1.ProcedureService.{name}"
    for name in ("ListProcedures", "GetProcedure", "ApproveProcedure", "RejectProcedure", "RollBackProcedure")
)
# RPCs whose reach crosses users by design (a run id may name threads of several users): refused to a
# call bound to an end user rather than answered for a subset it cannot see.
UNBOUND_ONLY = frozenset({"DeleteCheckpointRunsRequest"})


def _field(message: Any, path: str) -> tuple[Any, str] | None:
    """(the message holding the last part of ``path``, that part), if the request type has the path."""
    *parents, name = path.split(".")
    for part in parents:
        if part not in message.DESCRIPTOR.fields_by_name:
            return None
        message = getattr(message, part)
    return (message, name) if name in message.DESCRIPTOR.fields_by_name else None


def user_scoped(request: Any) -> bool:
    """Whether the request type names a user in one of the ways above."""
    return any(_field(request, p) is not None for p in (*USER_FIELDS, *SESSION_FIELDS))


class UserBinding:
    def __init__(self, sessions: SessionStore) -> None:
        self._sessions = sessions

    async def check(self, request: Any, caller: Caller) -> None:
        """Raises PermissionDenied unless every user the request names is ``caller.user_id``."""
        if not caller.user_id:
            return
        if request.DESCRIPTOR.name in UNBOUND_ONLY:
            raise PermissionDenied(
                f"{request.DESCRIPTOR.name[: -len('Request')]} spans threads of every user; a call bound"
                " to an end user may not make it"
            )
        for path in USER_FIELDS:
            found = _field(request, path)
            if found is None:
                continue
            holder, name = found
            if not getattr(holder, name):
                setattr(holder, name, caller.user_id)
            caller.check_user(getattr(holder, name), path)
        for path in SESSION_FIELDS:
            found = _field(request, path)
            if found is None:
                continue
            value = getattr(*found)
            for session_id in [value] if isinstance(value, str) else list(value):
                if not session_id:
                    continue
                try:
                    session = await self._sessions.get(session_id)
                except NotFound:
                    continue
                caller.check_user(session.user_id, path)
