"""The one id grammar (memlane_server.ids): what it accepts and refuses, and why."""

from __future__ import annotations

import pytest

from memlane_server.errors import InvalidArgument
from memlane_server.ids import check_id, id_problem, is_valid_id

ACCEPTED = [
    "alice",
    "o'brien",
    "bob+tag@example.com",
    "José",
    "user 42",
    "D3:7",
    "a\\')) OR true --",
    "01HZX3J8M5Q2",
    "web/eu",
    "用户",
    "x" * 128,
]
REFUSED = [
    ("", "empty"),
    ("x" * 129, "too long"),
    ("é" * 101, "too long"),  # 202 bytes of UTF-8
    ("a\nb", "control"),
    ("a\x00b", "control"),
    ("a\u2028b", "separator"),
    ("a\u202eb", "format"),
    ("a\u200bb", "format"),
    ("a\u00a0b", "separator"),
    (" alice", "start"),
    ("_x", "start"),
    (".hidden", "start"),
    ("alice ", "ends with a space"),
    ("a{b}", "{ or }"),
]


@pytest.mark.parametrize("value", ACCEPTED)
def test_accepted(value: str) -> None:
    assert is_valid_id(value), id_problem(value)


@pytest.mark.parametrize(("value", "why"), REFUSED)
def test_refused_with_a_reason(value: str, why: str) -> None:
    assert why in id_problem(value)
    with pytest.raises(InvalidArgument, match=r"^caller\.user_id "):
        check_id(value, "caller.user_id")


def test_a_session_id_has_no_slash_but_a_channel_may() -> None:
    check_id("web/eu", "channel")
    with pytest.raises(InvalidArgument, match="session id names archive files"):
        check_id("a/../../etc", "session_id")
    with pytest.raises(InvalidArgument, match=r"messages\[0\]\.session_id"):
        check_id("a/b", "messages[0].session_id")


def test_the_error_stays_on_one_line() -> None:
    with pytest.raises(InvalidArgument) as err:
        check_id("evil\nINFO forged log line", "user_id")
    assert "\n" not in str(err.value)
