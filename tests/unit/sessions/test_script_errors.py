"""What a session script's refusal means to the API (sessions/scripts.py ``script_error``): one mapping
every store on a session's slot uses."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from memlane_server.errors import AlreadyExists, Conflict, FailedPrecondition, NotFound, SessionExpired
from memlane_server.sessions.model import SessionStatus
from memlane_server.sessions.scripts import fill_statuses, script_error


@pytest.mark.parametrize(
    ("reply", "kind", "words"),
    [
        ("NOTFOUND", NotFound, "not found"),
        ("CLOSED", FailedPrecondition, "is closed"),
        ("EXPIRED", SessionExpired, "has expired"),
        ("CONFLICT m7", AlreadyExists, "'m7'"),
        (f"ILLEGAL {int(SessionStatus.IDLE)}", FailedPrecondition, "is idle"),
        ("ILLEGAL x", FailedPrecondition, "is x"),
        ("ALIVE", Conflict, "active again"),
        ("STALE", Conflict, "summary"),
    ],
)
def test_each_refusal_becomes_its_api_error(reply: str, kind: type[Exception], words: str) -> None:
    err = script_error(ResponseError(reply), "s1")
    assert isinstance(err, kind)
    assert words in str(err) and "'s1'" in str(err)


def test_any_other_reply_is_passed_on_as_it_came() -> None:
    exc = ResponseError("TTL 5000")
    assert script_error(exc, "s1") is exc


def test_scripts_are_filled_with_the_stored_status_digits() -> None:
    filled = fill_statuses("$CLOSED,$EXPIRED")
    assert filled == f"{int(SessionStatus.CLOSED)},{int(SessionStatus.EXPIRED)}"
