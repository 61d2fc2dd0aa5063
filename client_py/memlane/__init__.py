"""memlane: the Python client of the memlane memory sidecar.

The common path (sessions created on first use, context as OpenAI chat messages):

    from memlane import Memlane
    with Memlane("127.0.0.1:50051", agent_id="bot") as m:
        m.add("u1", "chat-1", [{"role": "user", "content": "hi"}])
        messages = m.context("chat-1", "hi")

with the memory's lifecycle beside it (``remember``, ``search``, ``get``, ``get_all``, ``update``,
``delete``, ``history``; ``close_session`` ends a conversation). Every RPC: ``Client`` /
``AsyncClient`` (``Memlane(...).client``), with the message and enum types exported here.
"""

from importlib import metadata as _metadata

from ._chat import ChatMessage
from ._client import DEFAULT_TARGET, AsyncClient, Client, address_from_env, iter_pages
from ._errors import (
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    ClientError,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    FieldViolation,
    InternalError,
    InvalidArgumentError,
    MemlaneError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    RetryableError,
    ServerError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
)
from ._ids import new_id
from ._memlane import AsyncMemlane, Memlane
from ._retry import NO_RETRY, RetryPolicy
from .v1.admin_pb2 import ExportFormat
from .v1.context_pb2 import (
    AssembleStats,
    ContextBlock,
    ContextMessage,
    ContextSection,
    ContextStrategy,
    HistoryFallback,
    MemoryRef,
    Provenance,
    TurnTrace,
)
from .v1.memory_pb2 import (
    Caller,
    FeedbackVerdict,
    IngestOutcome,
    Memory,
    MemoryChangeReason,
    MemoryFilter,
    MemoryKind,
    MemoryScope,
    MemoryVersion,
    ScoredMemory,
    ScoreParts,
    SearchMode,
)
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
from .v1.session_service_pb2 import AppendResult, MessageOrder

try:
    __version__ = _metadata.version("memlane")
except _metadata.PackageNotFoundError:  # run from a source tree without an install
    __version__ = "0+unknown"

__all__ = [
    "DEFAULT_TARGET",
    "NO_RETRY",
    "AbortedError",
    "AlreadyExistsError",
    "AppendResult",
    "AssembleStats",
    "AsyncClient",
    "AsyncMemlane",
    "Caller",
    "CancelledError",
    "ChatMessage",
    "Client",
    "ClientError",
    "ContextBlock",
    "ContextMessage",
    "ContextSection",
    "ContextStrategy",
    "DataLossError",
    "DeadlineExceededError",
    "ExportFormat",
    "FailedPreconditionError",
    "FeedbackVerdict",
    "FieldViolation",
    "HistoryFallback",
    "IngestOutcome",
    "InternalError",
    "InvalidArgumentError",
    "Memlane",
    "MemlaneError",
    "Memory",
    "MemoryChangeReason",
    "MemoryFilter",
    "MemoryKind",
    "MemoryRef",
    "MemoryScope",
    "MemoryVersion",
    "Message",
    "MessageOrder",
    "NativeMessage",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "PromotionState",
    "Provenance",
    "ResourceExhaustedError",
    "RetryPolicy",
    "RetryableError",
    "Role",
    "ScoreParts",
    "ScoredMemory",
    "SearchMode",
    "ServerError",
    "Session",
    "SessionStatus",
    "Summary",
    "Topology",
    "TurnTrace",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UnknownError",
    "VisibilityKind",
    "address_from_env",
    "iter_pages",
    "new_id",
]
