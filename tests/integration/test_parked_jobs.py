"""The session-end queue's dead-letter policy through the real server: a job that keeps failing is parked
after `pipeline_max_failures` runs (event, metric), listed and retried by an operator (RPC and CLI)."""

from __future__ import annotations

import json

import orjson
import pytest
import redis

import memlane
from memlane import Message, Role
from memlane.v1 import session_service_pb2 as spb
from memlane_server.background import SidecarThread
from memlane_server.cli import main
from memlane_server.keyspace import KeySpace
from memlane_server.sessions.codec import FINGERPRINT_LEN
from tests.conftest import ServerFactory, raw, wait_for

YEAR_10000_MS = 253_402_300_800_000


@pytest.fixture(scope="module")
def srv(start_server: ServerFactory) -> SidecarThread:
    return start_server(
        ltm_enabled=False,
        pipeline_claim_timeout_seconds=1.0,
        pipeline_max_failures=2,
        lifecycle_sweep_interval_seconds=0.2,
        metrics_sample_interval_seconds=0.2,
    )


def _set_message_time(srv: SidecarThread, redis_url: str, sid: str, ms: int) -> None:
    """Rewrites a stored message's time in Redis, as data written before times were validated."""
    r = redis.Redis.from_url(redis_url)
    key = KeySpace(srv.settings.redis.key_prefix).session(sid).messages
    for mid, payload in r.hgetall(key).items():
        stored = raw(payload)
        doc = orjson.loads(stored[FINGERPRINT_LEN:])
        doc["t"] = ms
        r.hset(key, mid, stored[:FINGERPRINT_LEN] + orjson.dumps(doc))
    r.close()


def _parked_total(srv: SidecarThread) -> float:
    value = srv.sidecar.registry.get_sample_value("memlane_session_end_jobs_parked_total")
    return value or 0.0


def _parked_gauge(srv: SidecarThread) -> float | None:
    return srv.sidecar.registry.get_sample_value("memlane_session_end_parked_jobs")


def _events(c: memlane.Client, sid: str) -> list[spb.SessionEvent]:
    out = []
    try:
        for item in c.watch_session_events(after_event_id="0", timeout=1.5):
            if item.event.session_id == sid:
                out.append(item.event)
    except memlane.DeadlineExceededError:
        pass
    return out


def test_a_failing_session_end_job_is_parked_and_can_be_retried(
    srv: SidecarThread, redis_url: str, user_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    target = ["--target", srv.target]
    with memlane.Client(srv.target, timeout=20) as c:
        # Control: a healthy session ends (ARCHIVED) and parks nothing.
        ok = c.create_session(user_id=user_id).session.session_id
        c.append_messages(session_id=ok, messages=[Message(role=Role.ROLE_USER, content="fine")])
        c.close_session(session_id=ok)
        wait_for(lambda: any(e.type == spb.SESSION_EVENT_TYPE_ARCHIVED for e in _events(c, ok)), 30)
        assert c.list_parked_jobs().jobs == []

        sid = c.create_session(user_id=user_id).session.session_id
        c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="poisoned")])
        _set_message_time(srv, redis_url, sid, YEAR_10000_MS)
        before = _parked_total(srv)
        c.close_session(session_id=sid)

        parked = wait_for(lambda: c.list_parked_jobs().jobs, 60)
        assert [(j.session_id, j.reason, j.failures) for j in parked] == [(sid, "closed", 2)]
        assert parked[0].error
        assert _parked_total(srv) == before + 1
        # The sampled gauge reads the parked stream's real length.
        wait_for(lambda: _parked_gauge(srv) == 1, 30)
        events = _events(c, sid)
        parked_events = [e for e in events if e.type == spb.SESSION_EVENT_TYPE_PARKED]
        assert len(parked_events) == 1 and parked_events[0].user_id == user_id
        assert parked_events[0].detail["parked_id"] == parked[0].parked_id
        assert parked_events[0].detail["failures"] == "2"
        assert not any(e.type == spb.SESSION_EVENT_TYPE_ARCHIVED for e in events)

        # The operator lists it (JSON lines), repairs the data and retries it from the CLI.
        assert main(["jobs", "list-parked", *target]) == 0
        listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [j["session_id"] for j in listed] == [sid]
        _set_message_time(srv, redis_url, sid, 1_700_000_000_000)
        assert main(["jobs", "retry-parked", parked[0].parked_id, *target]) == 0
        assert f"retried\t{parked[0].parked_id}\t{sid}" in capsys.readouterr().out
        wait_for(lambda: any(e.type == spb.SESSION_EVENT_TYPE_ARCHIVED for e in _events(c, sid)), 60)
        assert c.list_parked_jobs().jobs == []
        wait_for(lambda: _parked_gauge(srv) == 0, 30)
        # Retrying again is safe: the id is reported as no longer parked.
        again = c.retry_parked_jobs(parked_ids=[parked[0].parked_id])
        assert list(again.not_parked) == [parked[0].parked_id] and not again.retried


def test_parked_job_requests_are_validated(srv: SidecarThread) -> None:
    with memlane.Client(srv.target, timeout=10) as c:
        with pytest.raises(memlane.InvalidArgumentError, match="parked_ids or set all"):
            c.retry_parked_jobs()
        with pytest.raises(memlane.InvalidArgumentError, match=r"parked_ids\[0\]"):
            c.retry_parked_jobs(parked_ids=["1-2\n"])
        with pytest.raises(memlane.InvalidArgumentError, match="page_token"):
            c.list_parked_jobs(page_token="garbage")
        assert c.retry_parked_jobs(all=True).retried == []
