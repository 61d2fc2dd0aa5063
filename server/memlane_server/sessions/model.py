"""The session document and its messages, the channel policy recorded on it, and the book of channel
policies a sidecar reads from its file, as the domain sees them (no proto, no Redis); with them the
rules every reader and writer of messages applies: a reader's filter (``MessageFilter``), the session's
defaults a message gets (``with_session_defaults``, ``default_visibility``).

Channel policies: how long a session of a channel lives, how its context is built, what happens at its end.

A policy starts from a built-in kind and overrides fields; a file (YAML or TOML) names the channels::

    default:                 # optional: overrides for channels not listed below
      expire_after: 1h
    channels:
      web:   {kind: web_chat, expire_after: 20m, context_strategy: sliding_window, context_window_turns: 8}
      slack: {kind: messaging}
      jira:  {kind: internal_tool, work_item_key: ticket_id}
      voice: {learn: false}  # promote at session end only, not while the session is open

Durations are seconds (numbers) or strings with a unit (``90s``, ``15m``, ``1h``, ``7d``); 0 means "never"
(no time expiry, keep the archive forever). A policy that sets ``expire_after`` but not ``idle_after``
goes idle at the inherited ``idle_after`` or at its expiry, whichever comes first (``expire_after: 2m``
alone is idle after 2 minutes, not refused for the inherited 15); set both, and ``idle_after`` must
not exceed ``expire_after``. The resolved policy is recorded on the session document when
it is created, so editing the file later never changes what an existing session was promised.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from ..access.identity import UNRESTRICTED, Caller
from ..config import CHOICES
from ..errors import InvalidArgument

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


# ---------------------------------------------------------------- reading and writing messages


@dataclass(slots=True)
class MessageFilter:
    newest_first: bool = False
    after_ms: int = 0
    before_ms: int = 0
    roles: frozenset[Role] = field(default_factory=frozenset)
    source_agent_ids: frozenset[str] = field(default_factory=frozenset)
    participant_names: frozenset[str] = field(default_factory=frozenset)
    user_ids: frozenset[str] = field(default_factory=frozenset)  # compared after the session default
    viewer: Caller = UNRESTRICTED  # messages the viewer may not see are skipped silently

    def matches(self, m: Message) -> bool:
        if not self.viewer.can_see(m.visibility, m.source_agent_id, m.visibility_group):
            return False
        if self.after_ms and m.created_at_ms < self.after_ms:
            return False
        if self.before_ms and m.created_at_ms >= self.before_ms:
            return False
        if self.roles and m.role not in self.roles:
            return False
        if self.participant_names and m.participant_name not in self.participant_names:
            return False
        if self.user_ids and m.user_id not in self.user_ids:
            return False
        return not (self.source_agent_ids and m.source_agent_id not in self.source_agent_ids)

    @property
    def active(self) -> bool:
        narrowed = (
            self.after_ms
            or self.before_ms
            or self.roles
            or self.source_agent_ids
            or self.participant_names
            or self.user_ids
        )
        return bool(narrowed or not self.viewer.unrestricted)


def with_session_defaults(m: Message, user_id: str, channel: str) -> Message:
    """A message's user and channel default to its session's (stored empty, so the default follows the
    session); readers get them filled, as the proto promises."""
    m.user_id = m.user_id or user_id
    m.channel = m.channel or channel
    return m


DEFAULT_VISIBILITY = {
    Topology.UNSPECIFIED: VisibilityKind.SESSION,
    Topology.SHARED: VisibilityKind.SESSION,
    Topology.DISTRIBUTED: VisibilityKind.AGENT,
    Topology.SELECTIVE: VisibilityKind.GROUP,
}


def default_visibility(s: Session) -> tuple[VisibilityKind, str]:
    """The visibility (and group) a session's topology gives what is written without one: its messages,
    and its framework checkpoints, which are one agent's memory in a distributed session."""
    vis = DEFAULT_VISIBILITY[Topology(s.topology or Topology.SHARED)]
    return vis, s.group if vis == VisibilityKind.GROUP else ""


# ---------------------------------------- the book of channel policies (see the module docstring)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}


class PolicyError(ValueError):
    """The policy file is unusable; the message names the file, the channel and the field."""


def parse_duration(value: object, where: str) -> float:
    """Seconds from ``90``, ``"90s"``, ``"15m"``, ``"1h"``, ``"7d"``; ``"never"`` and 0 mean 0."""
    if isinstance(value, bool):
        raise PolicyError(f"{where}: expected a duration, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip().lower() in ("never", "none", "off"):
        seconds = 0.0
    elif isinstance(value, str) and (m := _DURATION.match(value.lower())):
        seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    else:
        raise PolicyError(f"{where}: cannot read {value!r} as a duration (e.g. 90, '15m', '1h', '7d')")
    if seconds < 0:
        raise PolicyError(f"{where}: must not be negative")
    return seconds


# The built-in kinds a channel starts from.
BUILTIN_KINDS: dict[str, ChannelPolicy] = {
    "default": ChannelPolicy(),
    # Asynchronous messaging (Slack, WhatsApp, email): people come back hours later; summary + resumption.
    "messaging": ChannelPolicy(
        kind="messaging",
        idle_after=3600.0,
        expire_after=3 * 86400.0,
        context_strategy="hybrid",
        context_window_turns=20,
        hot_retention=7 * 86400.0,
        archive_retention=365 * 86400.0,
        resume_turns=20,
    ),
    # Web chat: a visit; a sliding window is enough and the tab is gone after a short quiet spell.
    "web_chat": ChannelPolicy(
        kind="web_chat",
        idle_after=300.0,
        expire_after=1800.0,
        context_strategy="sliding_window",
        context_window_turns=12,
        hot_retention=3600.0,
        archive_retention=90 * 86400.0,
        resume_turns=12,
    ),
    # Internal tools: one session per work item, ended by an explicit close, never by the clock.
    "internal_tool": ChannelPolicy(
        kind="internal_tool",
        idle_after=3600.0,
        expire_after=0.0,
        context_strategy="hybrid",
        context_window_turns=20,
        hot_retention=86400.0,
        archive_retention=2 * 365 * 86400.0,
        work_item_key="ticket_id",
        resume_turns=20,
    ),
}

_DURATION_FIELDS = ("idle_after", "expire_after", "hot_retention", "archive_retention")


def _build(base: ChannelPolicy, channel: str, raw: Mapping[str, Any], where: str) -> ChannelPolicy:
    known = {f.name for f in fields(ChannelPolicy)} - {"channel"}
    values: dict[str, Any] = {}
    kind = raw.get("kind")
    if kind is not None:
        if kind not in BUILTIN_KINDS:
            raise PolicyError(f"{where}: unknown kind {kind!r}; known: {', '.join(sorted(BUILTIN_KINDS))}")
        base = BUILTIN_KINDS[str(kind)]
    for key, value in raw.items():
        if key == "kind":
            continue
        if key not in known:
            raise PolicyError(f"{where}: unknown field {key!r}; known: {', '.join(sorted(known))}")
        if key in _DURATION_FIELDS:
            values[key] = parse_duration(value, f"{where}.{key}")
        elif key in ("context_window_turns", "resume_turns"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PolicyError(f"{where}.{key}: expected a non-negative integer, got {value!r}")
            values[key] = value
        elif key == "context_strategy":
            if value not in ("", *CONTEXT_STRATEGIES):
                raise PolicyError(
                    f"{where}.context_strategy: unknown strategy {value!r}; "
                    f"known: {', '.join(CONTEXT_STRATEGIES)} (or empty for the server's context_strategy)"
                )
            values[key] = value
        elif key in ("promote", "learn"):
            if not isinstance(value, bool):
                raise PolicyError(f"{where}.{key}: expected true or false, got {value!r}")
            values[key] = value
        else:
            values[key] = str(value)
    if values.get("expire_after") and "idle_after" not in values:
        values["idle_after"] = min(base.idle_after, values["expire_after"])  # see the module's doc
    policy = dataclasses.replace(base, channel=channel, **values)
    if policy.expire_after and policy.idle_after > policy.expire_after:
        raise PolicyError(f"{where}: idle_after must not exceed expire_after")
    return policy


class PolicyBook:
    """The policies in force: the default plus one per configured channel."""

    def __init__(self, default: ChannelPolicy, channels: Mapping[str, ChannelPolicy] | None = None) -> None:
        self.default = default
        self.channels = dict(channels or {})

    @classmethod
    def load(cls, path: str | Path | None, *, default_expire_after: float) -> PolicyBook:
        """Reads the file (empty path: defaults only). ``default_expire_after`` is the server-wide
        session TTL, used by the default policy unless the file overrides it."""
        base = dataclasses.replace(
            BUILTIN_KINDS["default"],
            expire_after=float(default_expire_after),
            idle_after=min(BUILTIN_KINDS["default"].idle_after, float(default_expire_after) or float("inf")),
        )
        if not path:
            return cls(base)
        p = Path(path)
        try:
            text = p.read_text()
            data = tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
        except (OSError, tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
            raise PolicyError(f"channel policy file {p}: {exc}") from exc
        data = data or {}
        if not isinstance(data, dict) or set(data) - {"default", "channels"}:
            raise PolicyError(f"channel policy file {p}: expected a mapping with 'default' and 'channels'")
        for part in ("default", "channels"):
            if not isinstance(data.get(part) or {}, dict):
                raise PolicyError(f"{p}: {part}: expected a mapping")
        default = _build(base, "", data.get("default") or {}, f"{p}: default")
        channels: dict[str, ChannelPolicy] = {}
        for name, raw in (data.get("channels") or {}).items():
            if not isinstance(raw, dict):
                raise PolicyError(f"{p}: channels.{name}: expected a mapping")
            channels[str(name)] = _build(default, str(name), raw, f"{p}: channels.{name}")
        return cls(default, channels)

    def for_channel(self, channel: str) -> ChannelPolicy:
        policy = self.channels.get(channel)
        if policy is not None:
            return policy
        return dataclasses.replace(self.default, channel=channel)

    def for_session(self, session: Session) -> ChannelPolicy:
        """The policy recorded on the session at creation; the channel's current one for older sessions."""
        return session.policy if session.policy is not None else self.for_channel(session.channel)

    def apply(self, draft: Session) -> tuple[Session, int]:
        """Checks ``draft`` against its channel's policy and records the policy on it. Returns the draft
        and the TTL the store should use when the caller asked for none (0: no time expiry)."""
        policy = self.for_channel(draft.channel)
        if policy.work_item_key and not draft.metadata.get(policy.work_item_key):
            raise InvalidArgument(
                f"channel {draft.channel!r} binds every session to a work item: "
                f"metadata[{policy.work_item_key!r}] is required"
            )
        draft.policy = policy
        return draft, policy.expire_after_seconds
