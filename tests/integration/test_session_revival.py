"""An expired session taken up again, and an inactivity timeout changed while a session runs, through
the real server and Redis (two sidecars on one key prefix where a per-process cache could go stale).

Found by the chaos campaign (docs/reliability.md): a late append revived an expired session with no
event, so watchers saw EXPIRED twice for one session; and a TTL shortened by UpdateSession left the
session alive on its old timeout."""

from __future__ import annotations

import functools

from google.protobuf.field_mask_pb2 import FieldMask

import memlane
from memlane import Message, PromotionState, Role, SessionStatus
from memlane.v1 import session_pb2
from memlane.v1 import session_service_pb2 as spb
from tests.conftest import ServerFactory, redis_client, session_events, wait_for

EV = spb.SessionEventType
ACTIVE = SessionStatus.SESSION_STATUS_ACTIVE
EXPIRED = SessionStatus.SESSION_STATUS_EXPIRED
ARCHIVED = PromotionState.PROMOTION_STATE_ARCHIVED


def said(*texts: str) -> list[Message]:
    return [Message(message_id=f"m-{t}", role=Role.ROLE_USER, content=t) for t in texts]


def status(c: memlane.Client, sid: str) -> memlane.Session:
    return c.get_session(session_id=sid).session


def expired(c: memlane.Client, sid: str) -> memlane.Session | None:
    s = status(c, sid)
    return s if s.status == EXPIRED else None


def set_ttl(c: memlane.Client, sid: str, ttl: int) -> memlane.Session:
    change = session_pb2.Session(session_id=sid, ttl_seconds=ttl)
    return c.update_session(session=change, update_mask=FieldMask(paths=["ttl_seconds"])).session


def test_a_late_append_resumes_an_expired_session_with_its_event(
    start_server: ServerFactory, user_id: str
) -> None:
    srv = start_server(ltm_enabled=False, lifecycle_sweep_interval_seconds=0.2)
    with memlane.Client(srv.target, timeout=20) as c:
        sid = c.create_session(user_id=user_id, ttl_seconds=1).session.session_id
        first = said("one", "two")
        c.append_messages(session_id=sid, messages=first)
        ended = wait_for(lambda: (s := status(c, sid)).promotion_state == ARCHIVED and s, timeout=60)
        assert ended.status == EXPIRED

        # Control: a retried batch that is stored already changes nothing; the session stays ended.
        again = c.append_messages(session_id=sid, messages=first)
        assert [r.duplicate for r in again.results] == [True, True]
        assert status(c, sid).status == EXPIRED

        late = c.append_messages(session_id=sid, messages=said("three"))
        assert [r.seq for r in late.results] == [3] and not late.results[0].duplicate
        back = status(c, sid)
        assert back.status == ACTIVE
        # Its next end runs the pipeline for the new turn (a close queues a job only from NONE).
        assert back.promotion_state == PromotionState.PROMOTION_STATE_NONE
        # It ends again by itself, and that end archives the new turn.
        wait_for(lambda: (s := status(c, sid)).status == EXPIRED and s.promotion_state == ARCHIVED, 60)
    events = session_events(srv.target, sid, lambda ev: len(ev) >= 7)
    assert [e.type for e in events] == [
        EV.SESSION_EVENT_TYPE_EXPIRED,
        EV.SESSION_EVENT_TYPE_PROMOTED,
        EV.SESSION_EVENT_TYPE_ARCHIVED,
        EV.SESSION_EVENT_TYPE_RESUMED,
        EV.SESSION_EVENT_TYPE_EXPIRED,
        EV.SESSION_EVENT_TYPE_PROMOTED,
        EV.SESSION_EVENT_TYPE_ARCHIVED,
    ]
    resumed = events[3]
    assert resumed.status == ACTIVE and resumed.detail["reason"] == "append"
    assert events[6].detail["transcript"].endswith("0000000003-0000000003.parquet")


def test_appends_to_a_live_session_resume_nothing(start_server: ServerFactory, user_id: str) -> None:
    """Positive control for the test above: the same calls on a session that never ended write no
    RESUMED event."""
    srv = start_server(ltm_enabled=False)
    with memlane.Client(srv.target, timeout=20) as c:
        sid = c.create_session(user_id=user_id, ttl_seconds=600).session.session_id
        c.append_messages(session_id=sid, messages=said("one", "two"))
        c.append_messages(session_id=sid, messages=said("one", "two"))
        c.append_messages(session_id=sid, messages=said("three"))
        assert status(c, sid).status == ACTIVE
        c.close_session(session_id=sid)
    types = [e.type for e in session_events(srv.target, sid, lambda ev: len(ev) == 3)]
    assert types == [
        EV.SESSION_EVENT_TYPE_CLOSED,
        EV.SESSION_EVENT_TYPE_PROMOTED,
        EV.SESSION_EVENT_TYPE_ARCHIVED,
    ]


def test_a_shorter_ttl_brings_the_expiry_forward(
    start_server: ServerFactory, redis_url: str, user_id: str
) -> None:
    prefix = f"ttl{user_id[-8:]}"
    a = start_server(ltm_enabled=False, key_prefix=prefix)
    b = start_server(ltm_enabled=False, key_prefix=prefix)
    r = redis_client(redis_url)
    keys = a.sidecar.keys.session
    with memlane.Client(a.target, timeout=20) as ca, memlane.Client(b.target, timeout=20) as cb:
        # No append after the change: the running timeout itself must shrink.
        quiet = ca.create_session(user_id=user_id, ttl_seconds=600).session.session_id
        ca.append_messages(session_id=quiet, messages=said("q1"))
        assert r.pttl(keys(quiet).alive) > 500_000
        assert set_ttl(ca, quiet, 2).ttl_seconds == 2
        assert 0 < r.pttl(keys(quiet).alive) <= 2000
        # Appended to through another sidecar that read the session (and its 600 s) before the change.
        busy = ca.create_session(user_id=user_id, ttl_seconds=600).session.session_id
        cb.append_messages(session_id=busy, messages=said("b1"))
        set_ttl(ca, busy, 2)
        cb.append_messages(session_id=busy, messages=said("b2"))
        assert 0 < r.pttl(keys(busy).alive) <= 2000
        for sid in (quiet, busy):
            ended = wait_for(functools.partial(expired, ca, sid), timeout=60)
            assert ended.expired_at_unix_ms >= ended.last_activity_at_unix_ms + 2000
        # Control: a longer timeout pushes the expiry out, and an append through the other sidecar keeps it.
        longer = ca.create_session(user_id=user_id, ttl_seconds=2).session.session_id
        cb.append_messages(session_id=longer, messages=said("l1"))
        set_ttl(ca, longer, 600)
        cb.append_messages(session_id=longer, messages=said("l2"))
        assert r.pttl(keys(longer).alive) > 500_000
        assert r.zscore(a.sidecar.keys.deadlines(), longer) is not None
        # And 0 (no inactivity timeout) stops the clock: no expiry, no deadline for the sweeper.
        set_ttl(ca, longer, 0)
        cb.append_messages(session_id=longer, messages=said("l3"))
        assert r.pttl(keys(longer).alive) == -1
        assert r.zscore(a.sidecar.keys.deadlines(), longer) is None
        assert status(cb, longer).status == ACTIVE
    r.close()
