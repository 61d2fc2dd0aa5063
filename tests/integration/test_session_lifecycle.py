"""Session lifecycle through the real server and Redis: expiry (event path and sweeper), idle marking,
close, lifecycle events, channel policies, PromoteSession."""

from __future__ import annotations

import json
import time
from collections.abc import Generator
from pathlib import Path

import pytest

import memlane
from memlane import Message, PromotionState, Role, SessionStatus
from memlane.v1 import session_service_pb2 as spb
from memlane_server.keyspace import KeySpace
from tests.conftest import ServerFactory, hget, redis_client, session_events, wait_for

ARCHIVED = PromotionState.PROMOTION_STATE_ARCHIVED
EV = spb.SessionEventType


def turns(n: int) -> list[Message]:
    return [
        Message(role=Role.ROLE_USER if i % 2 == 0 else Role.ROLE_ASSISTANT, content=f"turn {i}")
        for i in range(n)
    ]


def archived(c: memlane.Client, sid: str) -> memlane.Session | None:
    s = c.get_session(session_id=sid).session
    return s if s.promotion_state == ARCHIVED else None


def write_policies(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_expiry_through_the_keyspace_event(start_server: ServerFactory, user_id: str) -> None:
    # A sweep interval longer than the test: only the expiry event can end the session in time.
    srv = start_server(ltm_enabled=False, lifecycle_sweep_interval_seconds=600)
    with memlane.Client(srv.target, timeout=10) as c:
        wait_for(srv.sidecar.lifecycle.listening.is_set)
        sid = c.create_session(user_id=user_id, ttl_seconds=1).session.session_id
        c.append_messages(session_id=sid, messages=turns(4))
        # Generous, yet far below the 600 s sweep interval: only the event can have ended it.
        done = wait_for(lambda: archived(c, sid), timeout=60)
        assert done.status == SessionStatus.SESSION_STATUS_EXPIRED
        assert done.expired_at_unix_ms >= done.last_activity_at_unix_ms + 1000
    types = [e.type for e in session_events(srv.target, sid, lambda ev: len(ev) == 3)]
    assert types == [
        EV.SESSION_EVENT_TYPE_EXPIRED,
        EV.SESSION_EVENT_TYPE_PROMOTED,
        EV.SESSION_EVENT_TYPE_ARCHIVED,
    ]


def test_an_append_moves_the_expiry(start_server: ServerFactory, user_id: str) -> None:
    """Each append re-arms the inactivity timer: a session of 2 s appended to again 1 s in expires 2 s
    after that append, not after the first. Read from the server's own times (last activity, expired
    at), so a slow machine changes when things happen, not what the test concludes."""
    srv = start_server(ltm_enabled=False, lifecycle_sweep_interval_seconds=600)
    with memlane.Client(srv.target, timeout=10) as c:
        wait_for(srv.sidecar.lifecycle.listening.is_set)
        sid = c.create_session(user_id=user_id, ttl_seconds=2).session.session_id
        c.append_messages(session_id=sid, messages=turns(2))
        first = c.get_session(session_id=sid).session.last_activity_at_unix_ms
        wait_for(lambda: time.time() * 1000 >= first + 1000)  # half way to the first deadline
        c.append_messages(session_id=sid, messages=turns(2))
        again = c.get_session(session_id=sid).session
        assert again.status == SessionStatus.SESSION_STATUS_ACTIVE  # re-armed before the first deadline
        rearmed = again.last_activity_at_unix_ms
        assert rearmed >= first + 1000
        done = wait_for(
            lambda: (
                (s := c.get_session(session_id=sid).session).status == SessionStatus.SESSION_STATUS_EXPIRED
                and s
            ),
            timeout=30,
        )
        # Not at the first deadline (first + 2 s) but 2 s after the last append.
        assert done.expired_at_unix_ms >= rearmed + 2000


def test_expiry_while_no_sidecar_was_running(
    start_server: ServerFactory, redis_url: str, user_id: str
) -> None:
    prefix = f"nosc{user_id}"
    first = start_server(ltm_enabled=False, key_prefix=prefix)
    with memlane.Client(first.target) as c:
        sid = c.create_session(user_id=user_id, ttl_seconds=1).session.session_id
        c.append_messages(session_id=sid, messages=turns(2))
    first.stop()
    r = redis_client(redis_url)
    keys = KeySpace(prefix)
    wait_for(lambda: not r.exists(keys.session(sid).alive), timeout=30)  # expired, nobody listening
    # No sidecar of this prefix runs, so nothing can have ended it: the doc still says ACTIVE...
    assert int(hget(r, keys.session(sid).doc, "status") or 0) == SessionStatus.SESSION_STATUS_ACTIVE
    second = start_server(ltm_enabled=False, key_prefix=prefix, keyspace_events_configure=False)
    with memlane.Client(second.target) as c:
        # ...until one starts: it finds the expiry it missed and ends the session.
        done = wait_for(lambda: archived(c, sid), timeout=60)
        assert done.status == SessionStatus.SESSION_STATUS_EXPIRED
    r.close()


def test_idle_marking_and_waking(start_server: ServerFactory, tmp_path: Path, user_id: str) -> None:
    policies = write_policies(
        tmp_path / "p.yaml", "channels:\n  slack: {kind: messaging, idle_after: 1s, expire_after: 1h}\n"
    )
    srv = start_server(
        ltm_enabled=False, channel_policies_file=policies, lifecycle_sweep_interval_seconds=0.2
    )
    with memlane.Client(srv.target) as c:
        sid = c.create_session(user_id=user_id, channel="slack").session.session_id
        c.append_messages(session_id=sid, messages=turns(1))
        idle = wait_for(
            lambda: (
                (s := c.get_session(session_id=sid).session).status == SessionStatus.SESSION_STATUS_IDLE and s
            ),
            timeout=30,
        )
        assert idle.idle_at_unix_ms >= idle.last_activity_at_unix_ms + 1000
        c.append_messages(session_id=sid, messages=turns(1))
        assert c.get_session(session_id=sid).session.status == SessionStatus.SESSION_STATUS_ACTIVE
        wait_for(
            lambda: c.get_session(session_id=sid).session.status == SessionStatus.SESSION_STATUS_IDLE, 30
        )
    types = [e.type for e in session_events(srv.target, sid, lambda ev: len(ev) == 2)]
    assert types == [EV.SESSION_EVENT_TYPE_IDLE, EV.SESSION_EVENT_TYPE_IDLE]


def test_close_and_watch_with_filters(start_server: ServerFactory, user_id: str) -> None:
    srv = start_server(ltm_enabled=False)
    with memlane.Client(srv.target, timeout=10) as c:
        a = c.create_session(user_id=user_id, channel="web").session.session_id
        b = c.create_session(user_id=user_id, channel="email").session.session_id
        # From the oldest retained event ("0"): the stream opens lazily, at the first read below.
        stream = c.watch_session_events(user_id=user_id, channel="web", after_event_id="0", timeout=30.0)
        c.append_messages(session_id=a, messages=turns(3))
        c.close_session(session_id=b)
        closed = c.close_session(session_id=a).session
        assert closed.status == SessionStatus.SESSION_STATUS_CLOSED
        assert c.close_session(session_id=a).session.closed_at_unix_ms == closed.closed_at_unix_ms
        seen: list[tuple[str, int]] = []
        for r in stream:
            seen.append((r.event.session_id, r.event.type))
            if r.event.type == EV.SESSION_EVENT_TYPE_ARCHIVED:
                break
        assert isinstance(stream, Generator)  # the blocking client's streams are generators
        stream.close()
        assert seen == [
            (a, EV.SESSION_EVENT_TYPE_CLOSED),
            (a, EV.SESSION_EVENT_TYPE_PROMOTED),
            (a, EV.SESSION_EVENT_TYPE_ARCHIVED),
        ]
        wait_for(lambda: archived(c, b))


def test_channel_policies_are_applied_and_recorded(
    start_server: ServerFactory, redis_url: str, tmp_path: Path, user_id: str
) -> None:
    policies = write_policies(
        tmp_path / "p.toml",
        """
[default]
expire_after = "45m"
[channels.web]
kind = "web_chat"
expire_after = "20m"
[channels.jira]
kind = "internal_tool"
[channels.quiet]
kind = "messaging"
promote = false
""",
    )
    srv = start_server(channel_policies_file=policies)
    with memlane.Client(srv.target, timeout=20) as c:
        web = c.create_session(user_id=user_id, channel="web").session
        assert web.ttl_seconds == 1200
        other = c.create_session(user_id=user_id, channel="anything").session
        assert other.ttl_seconds == 2700
        # Longer than the module runs: an expiry would start a promotion (LTM is on here) during teardown.
        explicit = c.create_session(user_id=user_id, channel="web", ttl_seconds=3000).session
        assert explicit.ttl_seconds == 3000
        with pytest.raises(memlane.InvalidArgumentError, match="ticket_id"):
            c.create_session(user_id=user_id, channel="jira")
        ticket = c.create_session(user_id=user_id, channel="jira", metadata={"ticket_id": "OPS-7"}).session
        assert ticket.ttl_seconds == 0  # no time expiry: explicit close only
        keys = srv.sidecar.keys
        r = redis_client(redis_url)
        recorded = json.loads(hget(r, keys.session(web.session_id).doc, "policy") or b"{}")
        assert recorded["kind"] == "web_chat" and recorded["context_strategy"] == "sliding_window"
        assert r.exists(keys.session(web.session_id).alive)
        assert not r.exists(keys.session(ticket.session_id).alive)
        assert r.zscore(keys.deadlines(), ticket.session_id) is None
        assert r.zscore(keys.deadlines(), web.session_id) is not None
        said = [Message(role=Role.ROLE_USER, content="I live in Lisbon.")]
        # Positive control: on a channel that promotes, the same turn becomes a memory...
        loud = c.create_session(user_id=user_id, channel="web").session.session_id
        c.append_messages(session_id=loud, messages=said)
        promoted = c.promote_session(session_id=loud, close=True)
        assert promoted.session.promotion_state == ARCHIVED and list(promoted.promoted_memory_ids)
        # ...and on one with promote = false it does not, though it is still archived.
        quiet = c.create_session(user_id=user_id, channel="quiet").session.session_id
        c.append_messages(session_id=quiet, messages=said)
        out = c.promote_session(session_id=quiet, close=True)
        assert out.session.promotion_state == ARCHIVED and list(out.promoted_memory_ids) == []
        assert len(out.archive_uris) == 1
        r.close()


def test_promote_session_rpc(start_server: ServerFactory, user_id: str) -> None:
    srv = start_server(ltm_enabled=False)
    with memlane.Client(srv.target, timeout=20) as c:
        sid = c.create_session(user_id=user_id).session.session_id
        c.append_messages(session_id=sid, messages=turns(6))
        with pytest.raises(memlane.FailedPreconditionError, match="close"):
            c.promote_session(session_id=sid)
        with pytest.raises(memlane.NotFoundError):
            c.promote_session(session_id="no-such-session", close=True)
        first = c.promote_session(session_id=sid, close=True)
        assert first.session.status == SessionStatus.SESSION_STATUS_CLOSED
        assert first.session.promotion_state == ARCHIVED and first.session.summary.through_seq == 6
        again = c.promote_session(session_id=sid)
        assert list(again.archive_uris) == list(first.archive_uris)


def test_a_short_expiry_alone_derives_its_idle_time(
    start_server: ServerFactory, tmp_path: Path, user_id: str
) -> None:
    """``expire_after: 2s`` alone used to be refused at start: the channel inherited idle_after 300 s
    (web_chat) or 900 s (default). It now goes idle when it expires, whichever comes first."""
    policies = write_policies(tmp_path / "p.yaml", "channels:\n  kiosk: {kind: web_chat, expire_after: 2s}\n")
    srv = start_server(ltm_enabled=False, channel_policies_file=policies)
    with memlane.Client(srv.target, timeout=10) as c:
        wait_for(srv.sidecar.lifecycle.listening.is_set)
        sid = c.create_session(user_id=user_id, channel="kiosk").session.session_id
        c.append_messages(session_id=sid, messages=turns(2))
        done = wait_for(
            lambda: (
                (s := c.get_session(session_id=sid).session).status == SessionStatus.SESSION_STATUS_EXPIRED
                and s
            ),
            timeout=60,
        )
        assert done.expired_at_unix_ms >= done.last_activity_at_unix_ms + 2000
    # Positive control: both set, and contradicting each other, is still refused.
    bad = write_policies(tmp_path / "bad.yaml", "channels:\n  kiosk: {idle_after: 10m, expire_after: 2m}\n")
    with pytest.raises(Exception, match="idle_after must not exceed expire_after"):
        start_server(ltm_enabled=False, channel_policies_file=bad)
