"""The structured part of a failed call: a ``google.rpc.Status`` in the ``grpc-status-details-bin``
trailer, as gRPC's rich error model defines it. Programs read the field at fault (``BadRequest``), a
stable reason (``ErrorInfo``) and when to retry (``RetryInfo``) instead of parsing the message."""

from __future__ import annotations

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc.error_details_pb2 import BadRequest, ErrorInfo, RetryInfo
from google.rpc.status_pb2 import Status

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
