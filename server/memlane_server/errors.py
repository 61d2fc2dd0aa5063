"""Domain exceptions. Domain code raises these; only ``api/`` maps them to gRPC status codes."""

from __future__ import annotations


class MemlaneError(Exception):
    """Root of every domain error. ``str(err)`` is safe to show to the caller."""


class InvalidArgument(MemlaneError):
    """The request is malformed; the message names the field."""


class NotFound(MemlaneError):
    """The named session, message, memory or trace does not exist (or is not visible to the caller)."""


class AlreadyExists(MemlaneError):
    """A client-chosen id is taken by something different."""


class FailedPrecondition(MemlaneError):
    """The request is well formed but the target's state forbids it (e.g. appending to a closed session)."""


class PermissionDenied(MemlaneError):
    """The caller is known but may not use this scope."""


class Unauthenticated(MemlaneError):
    """The caller presented no valid credentials."""


class ResourceExhausted(MemlaneError):
    """A size or count limit was exceeded; the message names the limit."""


class Unavailable(MemlaneError):
    """A backing store is unreachable; the call may be retried."""


class Conflict(FailedPrecondition):
    """A concurrent change won (e.g. a stale summary); re-read and retry."""
