"""Bad input gets a precise status, a message naming the field, and writes nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

import memlane
from memlane import Message, NativeMessage, Role, VisibilityKind
from memlane.v1 import session_service_pb2 as spb
from memlane_server.background import SidecarThread
from tests.conftest import ServerFactory


@pytest.fixture(scope="module")
def small(start_server: ServerFactory) -> SidecarThread:
    """A server with small limits so the limits are cheap to hit."""
    return start_server(max_message_bytes=1000, max_batch_messages=5, max_batch_bytes=3000)


@pytest.fixture(scope="module")
def c(small: SidecarThread) -> Iterator[memlane.Client]:
    with memlane.Client(small.target, timeout=10) as client:
        yield client


@pytest.fixture()
def sid(c: memlane.Client, user_id: str) -> str:
    return c.create_session(user_id=user_id).session.session_id


def _count(c: memlane.Client, sid: str) -> int:
    return c.get_session(session_id=sid).session.message_count


def _user(text: str = "x", **kw: Any) -> Message:
    return Message(role=Role.ROLE_USER, content=text, **kw)


@pytest.mark.parametrize(
    ("make", "error", "match", "reason", "field"),
    [
        (lambda: [], memlane.InvalidArgumentError, "messages must not be empty", "REQUIRED", "messages"),
        (
            lambda: [Message(content="no role")],
            memlane.InvalidArgumentError,
            r"messages\[0\]\.role",
            "UNKNOWN_VALUE",
            "messages[0].role",
        ),
        (
            lambda: [_user(), Message(role=Role.ValueType(99), content="x")],
            memlane.InvalidArgumentError,
            r"messages\[1\]\.role",
            "UNKNOWN_VALUE",
            "messages[1].role",
        ),
        (
            lambda: [_user(message_id="bad id\nwith a newline")],
            memlane.InvalidArgumentError,
            r"messages\[0\]\.message_id .* is not a valid id",
            "INVALID_ID",
            "messages[0].message_id",
        ),
        (
            lambda: [_user(message_id="dup"), _user(message_id="dup")],
            memlane.InvalidArgumentError,
            "appears twice",
            "DUPLICATE_ID",
            "messages[1].message_id",
        ),
        (
            lambda: [_user("y" * 1001)],
            memlane.ResourceExhaustedError,
            r"messages\[0\] is 1001 bytes; the limit is 1000",
            "MESSAGE_TOO_LARGE",
            "messages[0]",
        ),
        (
            lambda: [_user()] * 6,
            memlane.ResourceExhaustedError,
            "6 messages; at most 5",
            "BATCH_TOO_LARGE",
            "messages",
        ),
        (
            lambda: [_user("z" * 900)] * 4,
            memlane.ResourceExhaustedError,
            "batch is 3600 bytes",
            "BATCH_TOO_LARGE",
            "messages",
        ),
        (
            lambda: [Message(role=Role.ROLE_USER)],
            memlane.InvalidArgumentError,
            "no content",
            "EMPTY_MESSAGE",
            "messages[0]",
        ),
        (
            lambda: [_user(native=NativeMessage(format="langchain", json="{not json"))],
            memlane.InvalidArgumentError,
            r"native\.json is not valid JSON",
            "INVALID_JSON",
            "messages[0].native.json",
        ),
        (
            lambda: [_user(native=NativeMessage(json="{}"))],
            memlane.InvalidArgumentError,
            r"native\.format is required",
            "REQUIRED",
            "messages[0].native.format",
        ),
        (
            lambda: [_user(visibility=VisibilityKind.VISIBILITY_KIND_GROUP)],
            memlane.InvalidArgumentError,
            "visibility_group is required",
            "REQUIRED",
            "messages[0].visibility_group",
        ),
        (
            lambda: [_user(created_at_unix_ms=-5)],
            memlane.InvalidArgumentError,
            "created_at_unix_ms -5 is outside",
            "TIME_OUT_OF_RANGE",
            "messages[0].created_at_unix_ms",
        ),
    ],
)
def test_bad_messages_are_refused_whole(
    c: memlane.Client,
    sid: str,
    *,
    make: Callable[[], list[Message]],
    error: type[memlane.MemlaneError],
    match: str,
    reason: str,
    field: str,
) -> None:
    with pytest.raises(error, match=match) as caught:
        c.append_messages(session_id=sid, messages=make())
    # The structured details a program acts on: the field at fault and a stable reason.
    assert (caught.value.reason, caught.value.field) == (reason, field)
    assert not caught.value.retryable  # the same request would fail again
    assert _count(c, sid) == 0


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda c: c.get_session(session_id=""), memlane.InvalidArgumentError, "session_id is required"),
        (
            lambda c: c.get_session(session_id="nope-404"),
            memlane.NotFoundError,
            "session 'nope-404' not found",
        ),
        (lambda c: c.get_session(session_id="a{b}"), memlane.InvalidArgumentError, "not a valid id"),
        (
            lambda c: c.append_messages(session_id="nope-404", messages=[_user()]),
            memlane.NotFoundError,
            "not found",
        ),
        (lambda c: c.list_messages(session_id="nope-404"), memlane.NotFoundError, "not found"),
        (lambda c: c.close_session(session_id="nope-404"), memlane.NotFoundError, "not found"),
        (lambda c: c.create_session(user_id=""), memlane.InvalidArgumentError, "user_id is required"),
        (
            lambda c: c.create_session(user_id="u", ttl_seconds=-1),
            memlane.InvalidArgumentError,
            "ttl_seconds",
        ),
        (
            lambda c: c.list_sessions(user_id="u", page_token="garbage!"),
            memlane.InvalidArgumentError,
            "page_token",
        ),
        (lambda c: c.list_sessions(user_id="u", page_size=-1), memlane.InvalidArgumentError, "page_size"),
        (lambda c: c.list_sessions(status=42), memlane.InvalidArgumentError, "status 42"),
    ],
)
def test_bad_requests(
    c: memlane.Client, call: Callable[[memlane.Client], object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        call(c)


def test_page_token_is_bound_to_its_query(c: memlane.Client, sid: str) -> None:
    c.append_messages(session_id=sid, messages=[_user(str(i)) for i in range(5)])
    token = c.list_messages(session_id=sid, page_size=2).next_page_token
    assert token
    with pytest.raises(memlane.InvalidArgumentError, match="different query"):
        c.list_messages(session_id=sid, page_size=2, page_token=token, roles=[Role.ROLE_ASSISTANT])
    with pytest.raises(memlane.InvalidArgumentError, match="page_token"):
        c.list_messages(session_id=sid, page_token=token[:-3] + "xyz")


def test_invalid_utf8_is_invalid_argument(small: SidecarThread, c: memlane.Client, sid: str) -> None:
    # Hand-encoded AppendMessagesRequest: a Message whose content (field 4) holds the bytes ff fe.
    message = b"\x18\x01" + b"\x22\x02\xff\xfe"
    raw = b"\x0a" + bytes([len(sid)]) + sid.encode() + b"\x12" + bytes([len(message)]) + message
    with grpc.insecure_channel(small.target) as ch:
        call = ch.unary_unary("/memlane.v1.SessionService/AppendMessages")
        with pytest.raises(grpc.RpcError) as info:
            call(raw, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "UTF-8" in info.value.details() and "AppendMessagesRequest" in info.value.details()
    assert _count(c, sid) == 0


def test_grpc_errors_never_escape_the_client() -> None:
    with (
        memlane.Client("127.0.0.1:1", timeout=0.5, retry=memlane.RetryPolicy(max_attempts=2)) as dead,
        pytest.raises(memlane.MemlaneError) as info,
    ):
        dead.get_session(session_id="x")
    assert not isinstance(info.value, grpc.RpcError)
    assert isinstance(info.value, (memlane.UnavailableError, memlane.DeadlineExceededError))


def test_request_and_fields_are_exclusive(c: memlane.Client) -> None:
    with pytest.raises(TypeError, match="not both"):
        c.get_session(spb.GetSessionRequest(session_id="x"), session_id="y")
    with pytest.raises(TypeError, match="GetSessionRequest"):
        # Through an untyped view: the stubs reject the keyword statically, the runtime check is under test.
        untyped: Callable[..., object] = c.get_session
        untyped(no_such_field=1)
