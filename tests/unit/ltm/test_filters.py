"""The in-memory twin of the recall filter (ltm/filters.py ``narrowed_mask``) on hand-made columns."""

from __future__ import annotations

import numpy as np
import pytest

from memlane_server.ltm.filters import key, narrowed_mask
from memlane_server.ltm.model import MemoryFilter
from memlane_server.memory_kinds import MemoryKind, MemoryScope

COLS = {
    "kind": np.array(["fact", "episodic", "episodic", "preference"]),
    "scope": np.array(["user", "agent", "agent", "group"]),
    "channel_key": np.array([key("web"), key("web"), key("voice"), key("voice")]),
    "session_key": np.array([key("s1"), key("s1"), key("s2"), key("s1")]),
    "valid_until_ms": np.array([0, 0, 50, 500]),
    "occurred_at_ms": np.array([10, 20, 30, 40]),
}


def _rows(flt: MemoryFilter, now_ms: int = 100) -> list[int]:
    return [int(i) for i in np.flatnonzero(narrowed_mask(COLS, flt, now_ms))]


def test_expired_rows_drop_and_each_field_narrows() -> None:
    assert _rows(MemoryFilter()) == [0, 1, 3]  # row 2 stopped being valid at 50
    assert _rows(MemoryFilter(kinds=[MemoryKind.EPISODIC])) == [1]
    assert _rows(MemoryFilter(scopes=[MemoryScope.USER, MemoryScope.GROUP])) == [0, 3]
    assert _rows(MemoryFilter(channel="voice")) == [3]
    assert _rows(MemoryFilter(since_ms=20, until_ms=40)) == [1]


def test_episodes_from_one_channel_leave_other_kinds_alone() -> None:
    assert _rows(MemoryFilter(episodes_from_channel="voice"), now_ms=0) == [0, 2, 3]


def test_a_sessions_own_episodes_leave_and_its_other_kinds_stay() -> None:
    assert _rows(MemoryFilter(episodes_not_from_session="s1"), now_ms=0) == [0, 2, 3]
    assert _rows(MemoryFilter(episodes_not_from_session="s2"), now_ms=0) == [0, 1, 3]


def test_retired_items_are_not_served_from_memory() -> None:
    with pytest.raises(ValueError):
        narrowed_mask(COLS, MemoryFilter(include_retired=True), 100)
