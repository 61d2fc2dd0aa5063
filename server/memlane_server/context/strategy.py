"""Which strategy and window a request's history is built with: one precedence, one parser.

Precedence (first that is set wins): the request, the session's metadata ``memlane.context.strategy``,
the channel policy recorded on the session when it was created, the server's ``context_strategy``.
The sliding window's size follows the same order without the metadata step.
"""

from __future__ import annotations

from ..errors import InvalidArgument
from ..sessions.model import ChannelPolicy
from .model import AssembleRequest, Strategy

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
