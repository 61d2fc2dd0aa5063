"""Typed errors: one exception per gRPC status code. ``grpc.RpcError`` never escapes the client."""

from __future__ import annotations

import grpc


class MemlaneError(Exception):
    """Root of every error the memlane client raises."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, *, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class CancelledError(MemlaneError):
    code = grpc.StatusCode.CANCELLED


class UnknownError(MemlaneError):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgumentError(MemlaneError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(MemlaneError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFoundError(MemlaneError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(MemlaneError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDeniedError(MemlaneError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(MemlaneError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(MemlaneError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class AbortedError(MemlaneError):
    code = grpc.StatusCode.ABORTED


class OutOfRangeError(MemlaneError):
    code = grpc.StatusCode.OUT_OF_RANGE


class UnimplementedError(MemlaneError):
    code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(MemlaneError):
    code = grpc.StatusCode.INTERNAL


class UnavailableError(MemlaneError):
    code = grpc.StatusCode.UNAVAILABLE


class DataLossError(MemlaneError):
    code = grpc.StatusCode.DATA_LOSS


class UnauthenticatedError(MemlaneError):
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
    return cls(details or code.name, code=code)
