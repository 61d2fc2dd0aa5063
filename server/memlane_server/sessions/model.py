"""The session document and its messages, and the channel policy recorded on it, as the domain sees them
(no proto, no Redis)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..config import CHOICES

# The strategy names a policy may give (the same words as the ``context_strategy`` setting).
CONTEXT_STRATEGIES = CHOICES["context_strategy"]
# Sessions created before strategies were validated recorded "summary": a summary plus recent turns.
_LEGACY_STRATEGIES = {"summary": "hybrid"}


class Role(enum.IntEnum):
    """Author role of a message. Values match the proto enum ``memlane.v1.Role``."""

    UNSPECIFIED = 0
    USER = 1
    ASSISTANT = 2
    SYSTEM = 3
    TOOL = 4
    DEVELOPER = 5


class SessionStatus(enum.IntEnum):
    """Values match ``memlane.v1.SessionStatus``."""

    UNSPECIFIED = 0
    ACTIVE = 1
    IDLE = 2
    CLOSED = 3
    EXPIRED = 4


class PromotionState(enum.IntEnum):
    """Where a session stands in the session-end pipeline. Values match ``memlane.v1.PromotionState``."""

    UNSPECIFIED = 0
    NONE = 1
    PENDING = 2
    PROMOTING = 3
    PROMOTED = 4
    ARCHIVED = 5


class Topology(enum.IntEnum):
    """How a session's agents share memory. Values match ``memlane.v1.Topology``."""

    UNSPECIFIED = 0
    SHARED = 1
    DISTRIBUTED = 2
    SELECTIVE = 3


class VisibilityKind(enum.IntEnum):
    """Who may see a message. Values match ``memlane.v1.VisibilityKind``."""

    UNSPECIFIED = 0
    SESSION = 1  # every agent allowed to use the session (``participants`` restricts nothing)
    AGENT = 2  # only the source agent
    GROUP = 3  # only members of ``visibility_group``


@dataclass(slots=True)
class Message:
    """One message of a session. ``seq`` is the server-assigned order within the session (1-based)."""

    message_id: str
    session_id: str
    role: Role
    content: str
    seq: int = 0
    source_agent_id: str = ""
    participant_name: str = ""
    user_id: str = ""
    channel: str = ""
    # The framework's own message object, JSON text, with its format name ("langchain", "openai.responses").
    native_format: str = ""
    native_json: str = ""
    # An orchestrator's planning steps and the agents/tools it invoked.
    planning_steps: list[str] = field(default_factory=list)
    invoked: list[str] = field(default_factory=list)
    tool_call_ids: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    transient: bool = False
    visibility: VisibilityKind = VisibilityKind.SESSION  # UNSPECIFIED on input: the topology's default
    visibility_group: str = ""
    created_at_ms: int = 0  # the message's own timestamp (client-supplied or arrival time)
    token_count: int = 0


@dataclass(slots=True)
class ScopedSummary:
    """The rolling summary of the turns only some agents may read: one agent's private turns, or one
    agent's turns to one group. It covers the same range as the session's summary."""

    visibility: VisibilityKind  # AGENT or GROUP
    agent_id: str  # the turns' source agent
    group: str  # GROUP only
    text: str
    token_count: int = 0


@dataclass(slots=True)
class Summary:
    """The rolling summary and the last message (by seq) it covers.

    ``text`` holds the session-wide turns only: every agent of the session reads it. The turns only some
    agents may read are summarized apart, per scope, in ``scoped``, so each viewer gets a summary of
    exactly what it may see (``memlane_server.context.summaries``).
    """

    text: str = ""
    through_message_id: str = ""
    through_seq: int = 0
    token_count: int = 0
    updated_at_ms: int = 0
    scoped: list[ScopedSummary] = field(default_factory=list)


@dataclass(slots=True)
class ArchivePointer:
    """Where one archive part of a session went (pipelines/archive.py writes it). Stored with the
    pipeline's progress, and on the session's stub after retirement."""

    transcript: str
    summary: str
    traces: str
    first_seq: int
    last_seq: int
    message_rows: int

    def to_record(self) -> dict[str, Any]:
        return {
            "transcript": self.transcript,
            "summary": self.summary,
            "traces": self.traces,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "message_rows": self.message_rows,
        }

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> ArchivePointer:
        return cls(
            str(r["transcript"]),
            str(r["summary"]),
            str(r["traces"]),
            int(r["first_seq"]),
            int(r["last_seq"]),
            int(r.get("message_rows", 0)),
        )


@dataclass(slots=True)
class Retirement:
    """A retired stub: its messages, traces and framework state left Redis for the archive."""

    retired_at_ms: int
    archives: list[ArchivePointer] = field(default_factory=list)
    checkpoints_uri: str = ""  # the archived framework state ("": the session had none)


@dataclass(frozen=True, slots=True)
class ChannelPolicy:
    """What one channel's sessions get. Durations in seconds; 0 expiry / retention means never."""

    channel: str = ""  # "" for the default policy
    kind: str = "default"
    idle_after: float = 900.0  # active -> idle after this much quiet
    expire_after: float = 3600.0  # idle/active -> expired (the alive key's TTL); 0: explicit close only
    # How AssembleContext builds the history of this channel's sessions: one of CONTEXT_STRATEGIES, or ""
    # for the server's ``context_strategy``. A request or the session's metadata may still override it.
    context_strategy: str = ""
    context_window_turns: int = 0  # the sliding window's size; 0: the server's ``context_window_turns``
    hot_retention: float = 86400.0  # after archiving, messages stay in Redis this long
    archive_retention: float = 365 * 86400.0  # archives older than this are deleted; 0 keeps them
    promote: bool = True  # extract long-term memories at session end
    learn: bool = True  # ... and while the session is open (pipelines/incremental.py); needs promote
    work_item_key: str = ""  # metadata key a session must carry (e.g. "ticket_id"); "" = not bound
    resume_turns: int = 20  # turns reloaded into Redis when a retired session is resumed

    @property
    def expire_after_seconds(self) -> int:
        """The session TTL as the store keeps it: whole seconds, rounded up (a short policy still expires)."""
        return int(-(-self.expire_after // 1))

    def to_record(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ChannelPolicy:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in record.items() if k in known}
        strategy = values.get("context_strategy", "")
        if strategy not in CONTEXT_STRATEGIES:
            # A record written before validation: map the old word, else defer to the server setting.
            values["context_strategy"] = _LEGACY_STRATEGIES.get(str(strategy), "")
        return cls(**values)


@dataclass(slots=True)
class Session:
    """The session document. Counters (``token_total``, ``message_count``) are kept by the store."""

    session_id: str
    user_id: str
    agent_id: str = ""
    channel: str = ""
    participants: list[str] = field(default_factory=list)
    group: str = ""
    tags: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    status: SessionStatus = SessionStatus.ACTIVE
    created_at_ms: int = 0
    last_activity_at_ms: int = 0
    idle_at_ms: int = 0
    closed_at_ms: int = 0
    expired_at_ms: int = 0
    summary: Summary = field(default_factory=Summary)
    token_total: int = 0
    message_count: int = 0
    last_seq: int = 0
    promotion_state: PromotionState = PromotionState.NONE
    model: str = ""
    ttl_seconds: int = 0
    topology: Topology = Topology.SHARED
    # The lifecycle's own state (sessions/codec.py stores each in its own field of the document):
    policy: ChannelPolicy | None = None  # the channel's policy at creation (None: created before that)
    retirement: Retirement | None = None  # set while the session is a retired stub
    resumed_at_ms: int = 0  # when it last came back from the archive
