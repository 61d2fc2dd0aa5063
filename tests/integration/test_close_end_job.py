"""CloseSession always queues the session-end job, whatever de-duplication marker it finds.

Found by the chaos campaign: a CLOSED session never archived, with no job anywhere. The marker of
``enqueue_once`` only says "some job was queued recently"; close used it too, so a close (or the client's
retry of one) that met a marker it did not set queued nothing. Two ways to meet such a marker: a sidecar
killed, or Redis restarted, between the marker's SET and the XADD (the client retries the close on another
sidecar within the marker's window), or an expiry job in flight that finds the session alive, does
nothing and clears the marker after the close looked. Closed sessions have no deadline entry, so no sweep
ever queued them again.
"""

from __future__ import annotations

import pytest

import memlane
from memlane import Message, PromotionState, Role, SessionStatus
from memlane_server.keyspace import KeySpace
from memlane_server.sessions.ending import GROUP
from tests.conftest import ServerFactory, redis_client, wait_for

ARCHIVED = PromotionState.PROMOTION_STATE_ARCHIVED


def _archived(c: memlane.Client, sid: str) -> memlane.Session | None:
    s = c.get_session(session_id=sid).session
    return s if s.promotion_state == ARCHIVED else None


def _turns(n: int) -> list[Message]:
    return [
        Message(role=Role.ROLE_USER if i % 2 == 0 else Role.ROLE_ASSISTANT, content=f"t{i}") for i in range(n)
    ]


def test_close_queues_its_job_despite_a_marker_it_did_not_set(
    start_server: ServerFactory, user_id: str
) -> None:
    srv = start_server(ltm_enabled=False)
    keys = KeySpace(srv.settings.redis.key_prefix)
    r = redis_client(srv.settings.redis.redis_url)
    try:
        with memlane.Client(srv.target, timeout=10) as c:
            # Positive control: a plain close is archived.
            ok = c.create_session(user_id=user_id).session.session_id
            c.append_messages(session_id=ok, messages=_turns(2))
            c.close_session(session_id=ok)
            assert (
                wait_for(lambda: _archived(c, ok), timeout=30).status == SessionStatus.SESSION_STATUS_CLOSED
            )

            sid = c.create_session(user_id=user_id).session.session_id
            c.append_messages(session_id=sid, messages=_turns(2))
            # What a sidecar killed between the marker's SET and the XADD leaves: a marker, no job.
            r.set(keys.end_marker(sid), "closed", px=600_000)
            c.close_session(session_id=sid)
            done = wait_for(lambda: _archived(c, sid), timeout=30)
            assert done.status == SessionStatus.SESSION_STATUS_CLOSED
    finally:
        r.close()


def test_close_whose_job_was_never_queued_is_still_archived(
    start_server: ServerFactory, user_id: str
) -> None:
    """The state change landed, the XADD did not (a crash between them), and the caller never retried:
    the sweeper queues the job. The XADD is made to fail for real: the queue key holds a string."""
    srv = start_server(ltm_enabled=False, pipeline_claim_timeout_seconds=2)
    keys = KeySpace(srv.settings.redis.key_prefix)
    queue = keys.session_end_queue()
    r = redis_client(srv.settings.redis.redis_url)
    try:
        with memlane.Client(srv.target, timeout=10, retry=memlane.NO_RETRY) as c:
            sid = c.create_session(user_id=user_id).session.session_id
            c.append_messages(session_id=sid, messages=_turns(2))
            r.delete(queue)
            r.set(queue, "not a stream")
            with pytest.raises(memlane.MemlaneError):
                c.close_session(session_id=sid)
            r.delete(queue)
            r.xgroup_create(queue, GROUP, id="0", mkstream=True)
            assert c.get_session(session_id=sid).session.status == SessionStatus.SESSION_STATUS_CLOSED
            assert r.xlen(queue) == 0  # the crash's state: CLOSED, no job
            done = wait_for(lambda: _archived(c, sid), timeout=30)
            assert done.status == SessionStatus.SESSION_STATUS_CLOSED
            assert not r.zscore(keys.deadlines(), sid)  # the write-ahead entry does not outlive the job
    finally:
        r.close()
