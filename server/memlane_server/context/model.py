"""Context assembly's domain types (no proto, no Redis). Enum values match ``memlane.v1`` enums."""

from __future__ import annotations

import enum
from collections.abc import Awaitable
from dataclasses import dataclass, field

from ..access.identity import UNRESTRICTED, Caller
from ..errors import InvalidArgument
from ..ltm.model import ScoreParts
from ..sessions.model import ChannelPolicy, Message, Role, Summary


class Provenance(enum.IntEnum):
    """What a block holds. Matches ``memlane.v1.Provenance``."""

    UNSPECIFIED = 0
    SYSTEM = 1
    PROFILE = 2
    MEMORY = 3
    SUMMARY = 4
    CONVERSATION = 5
    PROCEDURE = 6  # approved procedures, in the system section's budget


class Section(enum.IntEnum):
    """Budget sections in priority order; HISTORY holds the summary and the recent turns.

    Matches ``memlane.v1.ContextSection``.
    """

    UNSPECIFIED = 0
    SYSTEM = 1
    PROFILE = 2
    MEMORY = 3
    HISTORY = 4


# The sections in priority order, listed once (by the enum above): budgets are granted, sections composed
# and streamed, and caps read and written in this order everywhere.
SECTION_ORDER: tuple[Section, ...] = tuple(s for s in Section if s is not Section.UNSPECIFIED)


def cap_name(section: Section) -> str:
    """The name of a section's cap (``SectionCaps.<name>``; ``<name>_tokens`` on the wire)."""
    return section.name.lower()


class Strategy(enum.IntEnum):
    """How the history section is built. Matches ``memlane.v1.ContextStrategy``."""

    UNSPECIFIED = 0
    FULL_BUFFER = 1  # every turn (newest kept when over budget)
    SLIDING_WINDOW = 2  # the last N turns
    ROLLING_SUMMARY = 3  # summary of all but the last couple of turns
    HYBRID = 4  # rolling summary of older turns + a recent window verbatim (the default)


class Fallback(enum.IntEnum):
    """What assembly did when the turns did not fit. Matches ``memlane.v1.HistoryFallback``."""

    UNSPECIFIED = 0
    NONE = 1
    GAP_SUMMARY = 2  # a fast extractive summary of the turns the stored summary does not cover yet
    DROPPED_OLDEST = 3  # the oldest turns were left out


@dataclass(slots=True)
class SectionCaps:
    """Per-request caps in tokens; 0 means the server default."""

    system: int = 0
    profile: int = 0
    memory: int = 0
    history: int = 0


@dataclass(slots=True)
class AssembleRequest:
    session_id: str
    user_input: str = ""
    model: str = ""
    context_window: int = 0  # explicit window size; 0: from the model name
    reserved_output: int = 0  # 0: the server default
    system_prompt: str | None = None  # None: the configured prompt; "" means none
    caps: SectionCaps = field(default_factory=SectionCaps)
    strategy: Strategy = Strategy.UNSPECIFIED
    window_turns: int = 0  # sliding window size; 0: the server default
    memory_limit: int = 0  # how many memories to recall; 0: the server default
    render_text: bool = False
    request_id: str = ""
    # Who the context is for: history and memories it may not see are left out.
    viewer: Caller = UNRESTRICTED
    # Sections left out (PROFILE, MEMORY, SUMMARY): an A/B baseline of what memory buys.
    omit: frozenset[Provenance] = frozenset()


@dataclass(slots=True)
class BlockMessage:
    """A message as the model will see it, with the stored native object when there is one."""

    role: Role
    content: str
    name: str = ""
    message_id: str = ""
    seq: int = 0
    native_format: str = ""
    native_json: str = ""


@dataclass(slots=True)
class MemoryRef:
    memory_id: str
    score: float = 0.0
    parts: ScoreParts | None = None  # recalled memories only (profile items are not ranked)


@dataclass(slots=True)
class ProcedureRef:
    agent_id: str  # the owning agent, "" for a group's procedure
    group: str
    procedure_id: str
    version: int


@dataclass(slots=True)
class Block:
    """One section's output. ``token_count`` is exact: the sum of its messages' chat-format costs."""

    provenance: Provenance
    token_count: int = 0
    messages: list[BlockMessage] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)
    memories: list[MemoryRef] = field(default_factory=list)
    rendered_text: str = ""
    cap_tokens: int = 0  # the most this block was allowed
    truncated: bool = False
    procedures: list[ProcedureRef] = field(default_factory=list)


@dataclass(slots=True)
class Truncation:
    """Something left out, and why."""

    section: Section
    reason: str
    tokens_removed: int = 0
    items_removed: int = 0
    memory_ids: list[str] = field(default_factory=list)  # which memories, where the section holds them


@dataclass(slots=True)
class SectionBudget:
    section: Section
    cap_tokens: int
    used_tokens: int


@dataclass(slots=True)
class SummaryRange:
    """Turns (after_seq, through_seq] that need summarizing (told to the client provider)."""

    after_seq: int
    through_seq: int
    through_message_id: str
    budget_tokens: int


@dataclass(slots=True)
class AssembleStats:
    trace_id: str = ""
    model: str = ""
    context_window: int = 0
    reserved_output: int = 0
    input_tokens: int = 0  # the new user input, when not already stored as the last turn
    total_tokens: int = 0  # sum of block token counts
    headroom_tokens: int = 0  # window - reserved - input - total (never negative)
    strategy: Strategy = Strategy.UNSPECIFIED
    summary_through_seq: int = 0
    summary_behind: bool = False
    fallback: Fallback = Fallback.NONE
    dropped_message_count: int = 0
    gap_message_count: int = 0
    summarization_scheduled: bool = False
    summary_request: SummaryRange | None = None
    budgets: list[SectionBudget] = field(default_factory=list)
    truncations: list[Truncation] = field(default_factory=list)
    elapsed_us: int = 0


@dataclass(slots=True)
class Flush:
    """One response of the assembly stream: blocks in section order; the last one has the stats.

    ``stored`` (last flush only) completes when the turn trace is stored: the stats, which carry its id,
    must not be sent before it (a GetTurnTrace right after the stream has to find it). Encoding the
    response meanwhile overlaps that round trip."""

    blocks: list[Block]
    stats: AssembleStats | None = None
    stored: Awaitable[None] | None = None


@dataclass(slots=True)
class TurnTrace:
    """Everything one assembly produced: enough to replay exactly what the model saw."""

    trace_id: str
    session_id: str
    created_at_ms: int
    request: AssembleRequest
    blocks: list[Block]
    stats: AssembleStats


@dataclass(slots=True)
class GapFold:
    """Turns the stored summary does not cover yet, to fold into a summary before the blocks are built.

    ``store_all``: the session has no summary at all (a resumption), so every scope is folded and the
    result stored; otherwise only the scopes the viewer may read are folded, for showing."""

    previous: Summary
    leaving: list[Message]  # every read turn through the gap's end, all visibilities
    budget_tokens: int
    store_all: bool


# --- strategy --------------------------------------------------------------------------------------------
# Which strategy and window a request's history is built with: one precedence, one parser.
#
# Precedence (first that is set wins): the request, the session's metadata ``memlane.context.strategy``,
# the channel policy recorded on the session when it was created, the server's ``context_strategy``.
# The sliding window's size follows the same order without the metadata step.

# Session metadata key that pins a session's strategy (e.g. "sliding_window").
STRATEGY_METADATA_KEY = "memlane.context.strategy"


def parse_strategy(name: str, where: str = "context strategy") -> Strategy:
    """``"sliding_window"`` (any case, ``-`` or ``_``) -> ``Strategy``; "" -> UNSPECIFIED."""
    key = name.strip().upper().replace("-", "_")
    if not key:
        return Strategy.UNSPECIFIED
    if key not in Strategy.__members__ or key == "UNSPECIFIED":
        raise InvalidArgument(f"{where}: unknown context strategy {name!r}")
    return Strategy[key]


def resolve_strategy(
    req: AssembleRequest, metadata: dict[str, str], channel: ChannelPolicy, server_default: Strategy
) -> Strategy:
    if req.strategy != Strategy.UNSPECIFIED:
        return req.strategy
    pinned = parse_strategy(metadata.get(STRATEGY_METADATA_KEY, ""), f"metadata[{STRATEGY_METADATA_KEY!r}]")
    if pinned != Strategy.UNSPECIFIED:
        return pinned
    # Channel policies are validated when they load (and old records normalized when read).
    by_channel = parse_strategy(channel.context_strategy, f"channel {channel.channel!r} context_strategy")
    return by_channel if by_channel != Strategy.UNSPECIFIED else server_default


def resolve_window_turns(req: AssembleRequest, channel: ChannelPolicy, server_default: int) -> int:
    return req.window_turns or channel.context_window_turns or server_default
