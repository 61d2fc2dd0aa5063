"""memlane: the Python client of the memlane memory sidecar.

from memlane import Client, Message, Role
with Client("127.0.0.1:50051") as c:
    s = c.create_session(user_id="u1").session
    c.append_messages(session_id=s.session_id, messages=[Message(role=Role.ROLE_USER, content="hi")])
"""

from importlib import metadata as _metadata

from ._client import DEFAULT_TARGET, AsyncClient, Client, iter_pages
from ._errors import (
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    MemlaneError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
)
from ._ids import new_id
from ._retry import NO_RETRY, RetryPolicy
from .v1.session_pb2 import (
    Message,
    NativeMessage,
    PromotionState,
    Role,
    Session,
    SessionStatus,
    Summary,
    Topology,
    VisibilityKind,
)
from .v1.session_service_pb2 import MessageOrder

try:
    __version__ = _metadata.version("memlane")
except _metadata.PackageNotFoundError:  # run from a source tree without an install
    __version__ = "0+unknown"

__all__ = [
    "DEFAULT_TARGET",
    "NO_RETRY",
    "AbortedError",
    "AlreadyExistsError",
    "AsyncClient",
    "CancelledError",
    "Client",
    "DataLossError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "InternalError",
    "InvalidArgumentError",
    "MemlaneError",
    "Message",
    "MessageOrder",
    "NativeMessage",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "PromotionState",
    "ResourceExhaustedError",
    "RetryPolicy",
    "Role",
    "Session",
    "SessionStatus",
    "Summary",
    "Topology",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UnknownError",
    "VisibilityKind",
    "iter_pages",
    "new_id",
]
