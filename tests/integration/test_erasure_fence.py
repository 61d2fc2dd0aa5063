"""ForgetUser and a session end in flight, through the real server and Redis.

Found by the chaos campaign (docs/reliability.md): an erasure that ran while a session-end run held the
user's turns was followed by that run's archive part and memories, so an erased user's data was left.
The erasure now holds the sessions' leases; here the test holds one, as a run in flight would."""

from __future__ import annotations

import threading
from typing import Any

import memlane
from memlane import Message, Role
from tests.conftest import ServerFactory, redis_client


def test_forget_user_waits_for_a_session_end_in_flight(
    start_server: ServerFactory, redis_url: str, user_id: str
) -> None:
    # No session-end worker: the test plays the part of a run in flight by holding the session's lease.
    srv = start_server(ltm_enabled=False, pipeline_enabled=False)
    keys = srv.sidecar.keys
    r = redis_client(redis_url)
    other = f"{user_id}-free"
    with memlane.Client(srv.target, timeout=120) as c:
        sids = {}
        for user in (user_id, other):
            sid = c.create_session(user_id=user).session.session_id
            c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="hello")])
            c.close_session(session_id=sid)
            sids[user] = sid
        # Positive control: nothing holds the other user's session, so their erasure goes through.
        assert c.forget_user(user_id=other).erased["redis.sessions"] == 1

        assert r.set(keys.lease(sids[user_id]), "a-run-in-flight", nx=True, px=60_000)
        out: dict[str, Any] = {}
        done = threading.Event()

        def forget() -> None:
            with memlane.Client(srv.target, timeout=120) as c2:
                out["receipt"] = c2.forget_user(user_id=user_id)
            done.set()

        worker = threading.Thread(target=forget)
        worker.start()
        assert not done.wait(3), "the erasure went ahead while a session end held the session"
        assert r.exists(keys.session(sids[user_id]).doc)
        r.delete(keys.lease(sids[user_id]))  # the run in flight ends
        assert done.wait(90)
        worker.join()
        assert out["receipt"].erased["redis.sessions"] == 1
        assert not r.exists(keys.session(sids[user_id]).doc)
    r.close()
