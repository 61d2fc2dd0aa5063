"""Input that used to be accepted and then poisoned later work (issue 11): out-of-range times, unbounded
lists, pages over the client's receive limit, malformed cursors. Each is refused at the boundary with
INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for size) naming the field, next to a control that is accepted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TypedDict, Unpack

import orjson
import pytest
from google.protobuf.field_mask_pb2 import FieldMask

import memlane
from memlane import Message, Role
from memlane_server.background import SidecarThread
from memlane_server.paging import encode_token, query_fingerprint
from tests.conftest import ServerFactory

YEAR_10000_MS = 253_402_300_800_000


@pytest.fixture(scope="module")
def small(start_server: ServerFactory) -> SidecarThread:
    return start_server(ltm_enabled=False, max_message_bytes=1000, max_batch_bytes=3000)


@pytest.fixture(scope="module")
def c(small: SidecarThread) -> Iterator[memlane.Client]:
    with memlane.Client(small.target, timeout=20) as client:
        yield client


@pytest.fixture()
def sid(c: memlane.Client, user_id: str) -> str:
    return c.create_session(user_id=user_id, channel="web").session.session_id


class _Fields(TypedDict, total=False):
    """The Message fields these tests vary."""

    created_at_unix_ms: int
    planning_steps: list[str]
    invoked: list[str]
    tool_call_ids: list[str]
    metadata: dict[str, str]
    participant_name: str
    user_id: str
    channel: str


def _user(text: str = "x", **kw: Unpack[_Fields]) -> Message:
    return Message(role=Role.ROLE_USER, content=text, **kw)


def _count(c: memlane.Client, sid: str) -> int:
    return c.get_session(session_id=sid).session.message_count


@pytest.mark.parametrize("bad", [YEAR_10000_MS, -5, 1_700_000_000, int(time.time() * 1000) + 3 * 86_400_000])
def test_message_times_outside_the_documented_range_are_refused(
    c: memlane.Client, sid: str, bad: int
) -> None:
    good = int(time.time() * 1000) - 3_600_000
    out = c.append_messages(session_id=sid, messages=[_user("control", created_at_unix_ms=good)])
    assert out.results[0].seq == 1
    with pytest.raises(memlane.InvalidArgumentError, match=r"messages\[1\]\.created_at_unix_ms .* outside"):
        c.append_messages(session_id=sid, messages=[_user("ok"), _user("bad", created_at_unix_ms=bad)])
    assert _count(c, sid) == 1
    msgs = c.list_messages(session_id=sid).messages
    assert [m.created_at_unix_ms for m in msgs] == [good]


def test_lists_and_metadata_count_toward_the_message_size(c: memlane.Client, sid: str) -> None:
    # The control: the same shape under the limit (1000 bytes) is stored.
    c.append_messages(session_id=sid, messages=[_user(planning_steps=["p" * 400], invoked=["tool-a"])])
    cases: list[tuple[Message, str]] = [
        (_user(planning_steps=["p" * 600, "q" * 600]), r"messages\[0\] is \d+ bytes"),
        (_user(invoked=["i" * 500, "j" * 500]), r"messages\[0\] is \d+ bytes"),
        (_user(tool_call_ids=[f"call-{i:04d}" for i in range(120)]), r"messages\[0\] is \d+ bytes"),
        (_user(metadata={"k": "v" * 999}), r"messages\[0\] is \d+ bytes"),
    ]
    for message, match in cases:
        with pytest.raises(memlane.ResourceExhaustedError, match=match):
            c.append_messages(session_id=sid, messages=[message])
    # Three messages of 900 bytes of planning steps each: 2700 + ids < 3000 only if lists were ignored.
    with pytest.raises(memlane.ResourceExhaustedError, match="batch is"):
        c.append_messages(session_id=sid, messages=[_user(planning_steps=["s" * 950])] * 4)
    assert _count(c, sid) == 1


def test_repeated_fields_are_bounded(c: memlane.Client, sid: str, user_id: str) -> None:
    many = [f"t{i}" for i in range(257)]
    with pytest.raises(memlane.InvalidArgumentError, match=r"messages\[0\]\.tool_call_ids has 257"):
        c.append_messages(session_id=sid, messages=[_user(tool_call_ids=many)])
    with pytest.raises(memlane.InvalidArgumentError, match="participants has 257"):
        c.create_session(user_id=user_id, participants=many)
    with pytest.raises(memlane.InvalidArgumentError, match="tags has 257"):
        c.create_session(user_id=user_id, tags=many)
    with pytest.raises(memlane.InvalidArgumentError, match=r"session\.tags has 257"):
        c.update_session(
            session=memlane.Session(session_id=sid, tags=many), update_mask=FieldMask(paths=["tags"])
        )
    with pytest.raises(memlane.InvalidArgumentError, match=r"participants\[0\] .*is too long"):
        c.create_session(user_id=user_id, participants=["x" * 2000])
    # Controls: 256 entries are fine.
    ok = c.create_session(user_id=user_id, participants=many[:256], tags=many[:256]).session
    assert len(ok.participants) == 256 and len(ok.tags) == 256


def test_pages_are_bounded_in_bytes(start_server: ServerFactory) -> None:
    srv = start_server(ltm_enabled=False)
    with memlane.Client(srv.target, timeout=60) as c:
        sid = c.create_session(user_id="pages-user").session.session_id
        big = "b" * (250 * 1024)
        for batch in range(4):
            c.append_messages(session_id=sid, messages=[_user(f"{batch}-{i} {big}") for i in range(5)])
        first = c.list_messages(session_id=sid)
        assert first.next_page_token, "20 messages of 250 KiB must not fit one page"
        assert first.ByteSize() <= 4 * 1024 * 1024 + 64 * 1024
        pages = list(memlane.iter_pages(lambda t: c.list_messages(session_id=sid, page_token=t), "messages"))
        assert [m.seq for m in pages] == list(range(1, 21))
        # Sessions too: sixteen of about 290 KiB each (lists at their bounds; participants are ids, so
        # at most 128 characters) do not fit one page.
        wide = [f"{i:03d}" + "t" * 1000 for i in range(256)]
        ids = [f"{i:03d}" + "p" * 120 for i in range(256)]
        made = {sid} | {
            c.create_session(user_id="pages-user", tags=wide, participants=ids).session.session_id
            for _ in range(16)
        }
        first_sessions = c.list_sessions(user_id="pages-user")
        assert first_sessions.next_page_token and first_sessions.ByteSize() <= 4 * 1024 * 1024 + 600 * 1024
        listed = list(
            memlane.iter_pages(lambda t: c.list_sessions(user_id="pages-user", page_token=t), "sessions")
        )
        assert sorted(s.session_id for s in listed) == sorted(made)


def _watch_first(c: memlane.Client, after: str) -> None:
    for _ in c.watch_session_events(after_event_id=after, timeout=3):
        return


@pytest.mark.parametrize(
    "after", ["1" * 25, "123\n", "18446744073709551616-0", "5-18446744073709551616", "\u0663", "1-2-3"]
)
def test_malformed_event_ids_are_invalid_argument(c: memlane.Client, after: str) -> None:
    with pytest.raises(memlane.InvalidArgumentError, match="after_event_id"):
        _watch_first(c, after)


def test_valid_event_id_is_accepted(c: memlane.Client, sid: str) -> None:
    c.close_session(session_id=sid)
    first = next(iter(c.watch_session_events(after_event_id="0", timeout=5)))
    assert first.event.event_id
    big = "18446744073709551615-18446744073709551615"  # the largest stream id: nothing after it
    with pytest.raises(memlane.DeadlineExceededError):
        _watch_first(c, big)


def _forged(q: str, cursor: list[object]) -> str:
    """A well-formed token of the listing's very query (so it passes the format and binding checks) that
    holds a cursor the server never issues: only the cursor's own check can refuse it."""
    return encode_token(q, cursor)


@pytest.mark.parametrize("cursor", [[True], [False], [1.5], ["7"], [], [1, 2], [None]])
def test_forged_message_page_tokens_are_invalid_argument(
    c: memlane.Client, sid: str, cursor: list[object]
) -> None:
    c.append_messages(session_id=sid, messages=[_user(str(i)) for i in range(3)])
    for q in (
        query_fingerprint("msgs", sid, False, 0, 0, [], []),  # the listing's query before the new filters
        query_fingerprint("msgs", sid, False, 0, 0, [], [], [], []),
    ):
        with pytest.raises(memlane.InvalidArgumentError, match="page_token"):
            c.list_messages(session_id=sid, page_token=_forged(q, cursor))
    # Control: a real token continues the listing.
    token = c.list_messages(session_id=sid, page_size=2).next_page_token
    assert [m.content for m in c.list_messages(session_id=sid, page_size=2, page_token=token).messages] == [
        "2"
    ]


def test_messages_carry_the_session_user_and_channel(c: memlane.Client, sid: str, user_id: str) -> None:
    c.append_messages(
        session_id=sid,
        messages=[
            _user("from the session user", participant_name="Ann"),
            _user("from a guest", user_id="guest-1", channel="phone", participant_name="Bob"),
            Message(role=Role.ROLE_ASSISTANT, content="reply", participant_name="Bot"),
        ],
    )
    msgs = c.list_messages(session_id=sid).messages
    assert [(m.user_id, m.channel) for m in msgs] == [
        (user_id, "web"),
        ("guest-1", "phone"),
        (user_id, "web"),
    ]
    by_user = c.list_messages(session_id=sid, user_ids=[user_id]).messages
    assert [m.content for m in by_user] == ["from the session user", "reply"]
    guest = c.list_messages(session_id=sid, user_ids=["guest-1"]).messages
    assert [m.content for m in guest] == ["from a guest"]
    by_name = c.list_messages(session_id=sid, participant_names=["Bob", "Bot"]).messages
    assert [m.content for m in by_name] == ["from a guest", "reply"]
    assert c.list_messages(session_id=sid, participant_names=["Nobody"]).messages == []
    lines = [
        orjson.loads(line)
        for part in c.export_user_data(user_id=user_id)
        if part.kind == "message"
        for line in part.data.splitlines()
    ]
    assert sorted((r["user_id"], r["channel"]) for r in lines if r["session_id"] == sid) == sorted(
        [(user_id, "web"), ("guest-1", "phone"), (user_id, "web")]
    )
