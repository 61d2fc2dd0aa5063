"""Typed errors: one exception per gRPC status code, under three grouping bases (as httpx groups its
errors): ``ClientError`` (the request is wrong: fix it, do not retry), ``RetryableError`` (try again,
after ``retry_after`` when the server said) and ``ServerError`` (a fault on the server's side);
``ResourceExhaustedError`` is overload or a size limit, so ``err.retryable`` tells.
``grpc.RpcError`` never escapes the client.

Each error carries the server's structured details when it sent them (``google.rpc`` ``BadRequest``,
``ErrorInfo``, ``RetryInfo``): ``field`` (the request field at fault, e.g. ``messages[3].content``),
``reason`` (a stable UPPER_SNAKE_CASE word such as ``INVALID_ID`` or ``OVERLOADED``), ``info`` and
``retry_after`` (seconds). Match on those, not on the message text.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

DETAILS_KEY = "grpc-status-details-bin"


@dataclass(frozen=True, slots=True)
class FieldViolation:
    field: str
    description: str


class MemlaneError(Exception):
    """Root of every error the memlane client raises."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        message: str,
        *,
        code: grpc.StatusCode | None = None,
        reason: str = "",
        field_violations: tuple[FieldViolation, ...] = (),
        info: dict[str, str] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.reason = reason
        self.field_violations = field_violations
        self.info = info or {}
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed later: a transient condition, or the server said when
        to come back (``retry_after``)."""
        return isinstance(self, RetryableError) or self.retry_after is not None

    @property
    def field(self) -> str:
        """The first request field at fault, or "" when the error names none."""
        return self.field_violations[0].field if self.field_violations else ""


class ClientError(MemlaneError):
    """The request was wrong (malformed, unknown target, not allowed, wrong state): retrying it as it is
    will fail again."""


class RetryableError(MemlaneError):
    """A transient condition (unavailable, deadline, aborted): the same request may succeed later;
    ``retry_after`` says when, if the server said."""


class ServerError(MemlaneError):
    """A fault on the server's side (internal error, data loss, unimplemented)."""


class CancelledError(MemlaneError):
    code = grpc.StatusCode.CANCELLED


class UnknownError(ServerError):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgumentError(ClientError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(RetryableError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFoundError(ClientError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(ClientError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDeniedError(ClientError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(MemlaneError):
    """Either the server is overloaded (``reason`` OVERLOADED, ``retry_after`` set, ``retryable``) or
    the request is over a size or count limit (e.g. MESSAGE_TOO_LARGE with ``field`` set), which no
    retry will pass: gRPC uses the one code for both, so it sits under no grouping base."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(ClientError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class AbortedError(RetryableError):
    code = grpc.StatusCode.ABORTED


class OutOfRangeError(ClientError):
    code = grpc.StatusCode.OUT_OF_RANGE


class UnimplementedError(ServerError):
    code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(ServerError):
    code = grpc.StatusCode.INTERNAL


class UnavailableError(RetryableError):
    code = grpc.StatusCode.UNAVAILABLE


class DataLossError(ServerError):
    code = grpc.StatusCode.DATA_LOSS


class UnauthenticatedError(ClientError):
    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE: dict[grpc.StatusCode, type[MemlaneError]] = {
    cls.code: cls
    for cls in (
        CancelledError,
        UnknownError,
        InvalidArgumentError,
        DeadlineExceededError,
        NotFoundError,
        AlreadyExistsError,
        PermissionDeniedError,
        ResourceExhaustedError,
        FailedPreconditionError,
        AbortedError,
        OutOfRangeError,
        UnimplementedError,
        InternalError,
        UnavailableError,
        DataLossError,
        UnauthenticatedError,
    )
}


def from_rpc_error(exc: grpc.RpcError) -> MemlaneError:
    """The typed error for a failed call (``exc`` is a grpc.Call as well as an RpcError)."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    cls = _BY_CODE.get(code, UnknownError)
    reason, violations, info, retry_after = _structured(exc)
    return cls(
        details or code.name,
        code=code,
        reason=reason,
        field_violations=violations,
        info=info,
        retry_after=retry_after,
    )


# reason, field violations, ErrorInfo metadata, retry delay in seconds
_Details = tuple[str, tuple[FieldViolation, ...], dict[str, str], float | None]


def _structured(exc: grpc.RpcError) -> _Details:
    """The ``google.rpc.Status`` details of the trailer, if the server sent any (and they parse)."""
    status = status_pb2.Status()
    try:
        trailers = exc.trailing_metadata() or () if hasattr(exc, "trailing_metadata") else ()
        raw = next((v for k, v in trailers if k == DETAILS_KEY), None)
        if isinstance(raw, bytes):
            status.ParseFromString(raw)
            return _read_details(status)
    except (DecodeError, TypeError, ValueError):  # a server's garbage is no reason to fail differently
        pass
    return "", (), {}, None


def _read_details(status: status_pb2.Status) -> _Details:
    reason, info, retry_after = "", dict[str, str](), None
    violations: tuple[FieldViolation, ...] = ()
    for detail in status.details:
        error_info, bad, retry = (
            error_details_pb2.ErrorInfo(),
            error_details_pb2.BadRequest(),
            error_details_pb2.RetryInfo(),
        )
        if detail.Unpack(error_info):  # Unpack says whether the detail is of that type
            reason, info = error_info.reason, dict(error_info.metadata)
        elif detail.Unpack(bad):
            violations = tuple(FieldViolation(v.field, v.description) for v in bad.field_violations)
        elif detail.Unpack(retry):
            retry_after = retry.retry_delay.ToMilliseconds() / 1000
    return reason, violations, info, retry_after
