"""Domain exceptions. Domain code raises these; only ``api/`` maps them to gRPC status codes.

Besides its message (safe to show to the caller), an error carries what a program needs to act on it
without parsing text: the request ``field`` at fault (a path such as ``messages[3].content``) and a
stable ``reason`` (UPPER_SNAKE_CASE, one per kind of failure). The boundary sends both as the standard
``google.rpc`` details (``BadRequest`` field violation, ``ErrorInfo``); the client exposes them.
"""

from __future__ import annotations


class MemlaneError(Exception):
    """Root of every domain error. ``str(err)`` is safe to show to the caller."""

    reason = "ERROR"
    # When set, the caller may retry after this many milliseconds (a RetryInfo detail and a trailer).
    retry_after_ms: int | None = None

    def __init__(
        self, message: str, *, field: str = "", reason: str = "", retry_after_ms: int | None = None
    ) -> None:
        super().__init__(message)
        self.field = field
        if reason:
            self.reason = reason
        # When a retry may succeed (a store restarting, space freed): sent as RetryInfo and retry-after-ms.
        self.retry_after_ms = retry_after_ms


class InvalidArgument(MemlaneError):
    """The request is malformed; the message names the field."""

    reason = "INVALID_ARGUMENT"


class NotFound(MemlaneError):
    """The named session, message, memory or trace does not exist (or is not visible to the caller)."""

    reason = "NOT_FOUND"


class AlreadyExists(MemlaneError):
    """A client-chosen id is taken by something different."""

    reason = "ALREADY_EXISTS"


class FailedPrecondition(MemlaneError):
    """The request is well formed but the target's state forbids it (e.g. appending to a closed session)."""

    reason = "FAILED_PRECONDITION"


class PermissionDenied(MemlaneError):
    """The caller is known but may not use this scope."""

    reason = "PERMISSION_DENIED"


class Unauthenticated(MemlaneError):
    """The caller presented no valid credentials."""

    reason = "UNAUTHENTICATED"


class ResourceExhausted(MemlaneError):
    """A size or count limit was exceeded; the message names the limit."""

    reason = "LIMIT_EXCEEDED"


class Unavailable(MemlaneError):
    """A backing store is unreachable; the call may be retried."""

    reason = "UNAVAILABLE"


class DataLoss(MemlaneError):
    """Stored data is damaged (a truncated or overwritten file): retrying does not help; the message says
    which store and what an operator can do."""

    reason = "DATA_DAMAGED"


class SessionExpired(FailedPrecondition):
    """New messages for an expired session: it must be resumed first (AppendMessages does so itself)."""

    reason = "SESSION_EXPIRED"


class Conflict(FailedPrecondition):
    """A concurrent change won (e.g. a stale summary); re-read and retry."""

    reason = "CONFLICT"
