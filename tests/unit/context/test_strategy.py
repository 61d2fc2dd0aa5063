"""Which strategy and window a request's history is built with (context/model.py): one precedence,
request > session metadata > channel policy > server default, and one parser for every source."""

from __future__ import annotations

import pytest

from memlane_server.context.model import (
    STRATEGY_METADATA_KEY,
    AssembleRequest,
    Strategy,
    parse_strategy,
    resolve_strategy,
    resolve_window_turns,
)
from memlane_server.errors import InvalidArgument
from memlane_server.sessions.model import ChannelPolicy

DEFAULT = Strategy.HYBRID
PINNED = {STRATEGY_METADATA_KEY: "rolling-summary"}
CHANNEL = ChannelPolicy(channel="support", context_strategy="full_buffer", context_window_turns=7)


@pytest.mark.parametrize(
    ("req", "metadata", "channel", "expected"),
    [
        (Strategy.SLIDING_WINDOW, PINNED, CHANNEL, Strategy.SLIDING_WINDOW),
        (Strategy.UNSPECIFIED, PINNED, CHANNEL, Strategy.ROLLING_SUMMARY),
        (Strategy.UNSPECIFIED, {}, CHANNEL, Strategy.FULL_BUFFER),
        (Strategy.UNSPECIFIED, {}, ChannelPolicy(), DEFAULT),
    ],
)
def test_the_first_source_that_names_a_strategy_wins(
    req: Strategy, metadata: dict[str, str], channel: ChannelPolicy, expected: Strategy
) -> None:
    assert resolve_strategy(AssembleRequest("s", strategy=req), metadata, channel, DEFAULT) == expected


def test_the_window_skips_the_metadata_step() -> None:
    assert resolve_window_turns(AssembleRequest("s", window_turns=3), CHANNEL, 10) == 3
    assert resolve_window_turns(AssembleRequest("s"), CHANNEL, 10) == 7
    assert resolve_window_turns(AssembleRequest("s"), ChannelPolicy(), 10) == 10


def test_names_parse_in_any_case_with_dashes_or_underscores() -> None:
    assert parse_strategy(" Sliding-Window ") == Strategy.SLIDING_WINDOW
    assert parse_strategy("") == Strategy.UNSPECIFIED
    for bad in ("unspecified", "newest"):
        with pytest.raises(InvalidArgument, match="unknown context strategy"):
            parse_strategy(bad)


def test_a_bad_pin_in_the_metadata_names_where_it_came_from() -> None:
    with pytest.raises(InvalidArgument, match=STRATEGY_METADATA_KEY):
        resolve_strategy(AssembleRequest("s"), {STRATEGY_METADATA_KEY: "x"}, ChannelPolicy(), DEFAULT)
