"""The rules every reader and writer of messages applies (sessions/model.py), without a server: the
visibility a session's topology gives, the session's defaults a message is read with, a reader's filter,
and the durations of a channel policy file."""

from __future__ import annotations

import pytest

from memlane_server.access.identity import Caller
from memlane_server.errors import InvalidArgument
from memlane_server.sessions.model import (
    ChannelPolicy,
    Message,
    MessageFilter,
    PolicyBook,
    PolicyError,
    Role,
    Session,
    Topology,
    VisibilityKind,
    default_visibility,
    parse_duration,
    with_session_defaults,
)


@pytest.mark.parametrize(
    ("topology", "group", "expected"),
    [
        (Topology.SHARED, "g", (VisibilityKind.SESSION, "")),
        (Topology.UNSPECIFIED, "g", (VisibilityKind.SESSION, "")),
        (Topology.DISTRIBUTED, "g", (VisibilityKind.AGENT, "")),
        (Topology.SELECTIVE, "g", (VisibilityKind.GROUP, "g")),
    ],
)
def test_a_sessions_topology_gives_the_default_visibility(
    topology: Topology, group: str, expected: tuple[VisibilityKind, str]
) -> None:
    assert default_visibility(Session("s", "u", topology=topology, group=group)) == expected


def test_a_message_is_read_with_its_sessions_user_and_channel() -> None:
    m = with_session_defaults(Message("m", "s", Role.USER, "hi"), "u1", "web")
    assert (m.user_id, m.channel) == ("u1", "web")
    own = with_session_defaults(
        Message("m", "s", Role.USER, "hi", user_id="u2", channel="voice"), "u1", "web"
    )
    assert (own.user_id, own.channel) == ("u2", "voice")


def test_the_filter_keeps_what_every_condition_allows() -> None:
    m = Message("m", "s", Role.USER, "hi", created_at_ms=100, user_id="u1", participant_name="ann")
    assert MessageFilter().matches(m) and not MessageFilter().active
    assert MessageFilter(after_ms=100, before_ms=101).matches(m)
    assert not MessageFilter(before_ms=100).matches(m)  # before is exclusive
    assert not MessageFilter(after_ms=101).matches(m)
    assert not MessageFilter(roles=frozenset({Role.ASSISTANT})).matches(m)
    assert not MessageFilter(user_ids=frozenset({"u2"})).matches(m)
    assert not MessageFilter(participant_names=frozenset({"bob"})).matches(m)
    assert MessageFilter(roles=frozenset({Role.USER})).active


def test_a_restricted_viewer_does_not_see_another_agents_private_turn() -> None:
    private = Message("m", "s", Role.ASSISTANT, "x", source_agent_id="a2", visibility=VisibilityKind.AGENT)
    viewer = MessageFilter(viewer=Caller("a1"))
    assert viewer.active  # a restricted viewer narrows every page
    assert not viewer.matches(private)
    assert MessageFilter(viewer=Caller("a2")).matches(private)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (90, 90.0),
        ("90s", 90.0),
        ("15m", 900.0),
        ("1h", 3600.0),
        ("7d", 604800.0),
        ("never", 0.0),
        ("500ms", 0.5),
    ],
)
def test_durations_read_as_seconds(text: object, seconds: float) -> None:
    assert parse_duration(text, "x") == seconds


@pytest.mark.parametrize("bad", [True, "-5s", "soon", "5 years", -1])
def test_what_is_no_duration_is_refused(bad: object) -> None:
    with pytest.raises(PolicyError):
        parse_duration(bad, "x")


def test_a_work_item_channel_requires_its_key() -> None:
    book = PolicyBook.load("", default_expire_after=600)
    draft, ttl = book.apply(Session("s", "u", channel="web"))
    assert ttl == 600 and draft.policy is not None and draft.policy.expire_after == 600
    bound = PolicyBook(book.default, {"jira": ChannelPolicy(channel="jira", work_item_key="t")})
    with pytest.raises(InvalidArgument, match="work item"):
        bound.apply(Session("s", "u", channel="jira"))
