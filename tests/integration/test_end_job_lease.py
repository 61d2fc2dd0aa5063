"""A session-end job that finds the session held by someone else, through the real server and Redis.

The job must stay queued and run once the holder lets go: a holder that is not running this job (an
open-session learner, a resumption, a run whose lease lapsed) finishes nothing for it. The chaos
campaign (docs/reliability.md) left a closed session PROMOTING with no job anywhere; the worker used to
drop the job when the lease was gone by the time it looked again. That interleaving (the holder letting
go between two Redis calls) cannot be forced from outside, so this test pins the behaviour instead."""

from __future__ import annotations

import memlane
from memlane import Message, PromotionState, Role
from tests.conftest import ServerFactory, redis_client, wait_for


def test_a_job_meeting_a_held_session_runs_once_it_is_free(
    start_server: ServerFactory, redis_url: str, user_id: str
) -> None:
    srv = start_server(ltm_enabled=False, pipeline_claim_timeout_seconds=2)
    keys = srv.sidecar.keys
    r = redis_client(redis_url)
    with memlane.Client(srv.target, timeout=30) as c:
        sid = c.create_session(user_id=user_id).session.session_id
        c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="hello")])
        # Held by someone that is not running the session end (as a learner holds it for a moment).
        assert r.set(keys.lease(sid), "someone-else", nx=True, px=3000)
        c.close_session(session_id=sid)
        wait_for(lambda: not r.exists(keys.lease(sid)), timeout=30)
        done = wait_for(
            lambda: (
                (s := c.get_session(session_id=sid).session).promotion_state
                == PromotionState.PROMOTION_STATE_ARCHIVED
                and s
            ),
            timeout=60,
        )
        assert done.status == memlane.SessionStatus.SESSION_STATUS_CLOSED
    r.close()
