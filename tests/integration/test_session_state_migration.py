"""A retired stub written before the lifecycle's typed fields (all of it inside one JSON field ``extra``)
is still found retired, resumed from its archive, and rewritten in the new layout, through the real
server."""

from __future__ import annotations

from pathlib import Path

import orjson

import memlane
from memlane import Message, Role, SessionStatus
from memlane.v1 import session_service_pb2 as spb
from tests.conftest import ServerFactory, hget, redis_client, session_events, wait_for


def test_a_legacy_retired_stub_resumes_and_is_migrated(
    start_server: ServerFactory, redis_url: str, tmp_path: Path, user_id: str
) -> None:
    policies = tmp_path / "p.yaml"
    policies.write_text("channels:\n  chat: {kind: messaging, hot_retention: 0, resume_turns: 3}\n")
    srv = start_server(ltm_enabled=False, channel_policies_file=str(policies))
    doc = srv.sidecar.keys.session
    r = redis_client(redis_url)
    with memlane.Client(srv.target, timeout=20) as c:
        sid = c.create_session(user_id=user_id, channel="chat").session.session_id
        c.append_messages(
            session_id=sid,
            messages=[Message(role=Role.ROLE_USER, content=f"turn {i}") for i in range(8)],
        )
        c.close_session(session_id=sid)
        wait_for(lambda: hget(r, doc(sid).doc, "retired_at_ms"))
        # Rewrite the stub as the previous release stored it.
        new = {
            n: hget(r, doc(sid).doc, n) for n in ("policy", "retired_at_ms", "archives", "checkpoints_uri")
        }
        assert new["policy"] and new["archives"]
        r.hdel(doc(sid).doc, *new)
        legacy = {
            "policy": orjson.loads(new["policy"] or b"{}"),
            "retired_at_ms": int(new["retired_at_ms"] or 0),
            "archive": orjson.loads(new["archives"] or b"[]"),
        }
        r.hset(doc(sid).doc, "extra", orjson.dumps(legacy))

        resumed = c.get_session(session_id=sid).session  # found retired in the old layout, reloaded
        assert resumed.status == SessionStatus.SESSION_STATUS_ACTIVE
        assert [m.content for m in c.list_messages(session_id=sid).messages] == [
            f"turn {i}" for i in (5, 6, 7)
        ]
    stored = r.hgetall(doc(sid).doc)
    assert b"extra" not in stored and b"retired_at_ms" not in stored and b"archives" not in stored
    assert orjson.loads(stored[b"policy"]) == legacy["policy"]  # the recorded policy survived the move
    assert int(stored[b"resumed_at_ms"]) > 0
    events = session_events(
        srv.target, sid, lambda ev: spb.SESSION_EVENT_TYPE_RESUMED in [e.type for e in ev]
    )
    assert [e.type for e in events].count(spb.SESSION_EVENT_TYPE_RESUMED) == 1
    r.close()
