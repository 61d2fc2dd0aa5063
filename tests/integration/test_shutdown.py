"""SIGTERM drains a real ``memlane serve`` process: new calls are refused, WatchSessionEvents streams end
at once, the call in flight finishes within the grace period or, when its work outlasts the grace, is
answered UNAVAILABLE (``SHUTTING_DOWN``) with its job left to another sidecar; session-end jobs go back to
the queue so another sidecar takes them at once (not after the claim timeout, here 10 minutes).

Nothing here depends on how fast the machine is: where a test needs work to last, it holds it (a sidecar
that runs no jobs, until the test starts a worker), every wait polls for its condition, and the second
sidecar that takes a handed-back job starts only after the first has exited.
"""

from __future__ import annotations

import collections
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import memlane
from memlane import Message, PromotionState, Role, SessionStatus
from memlane_server.keyspace import KeySpace
from memlane_server.sessions.events import EventType
from tests.conftest import delete_prefix, hget, redis_client, wait_for
from tests.integration.test_session_end_pipeline import SidecarProcess, _events
from tests.integration.test_worker_processes import WorkerProcess

ARCHIVED = PromotionState.PROMOTION_STATE_ARCHIVED
PROMOTING = PromotionState.PROMOTION_STATE_PROMOTING
CLOSED = SessionStatus.SESSION_STATUS_CLOSED
SETTINGS = {
    "pipeline_chunk_messages": 5,
    "pipeline_claim_timeout_seconds": 600,  # without a hand-back nobody could take a job for 10 minutes
    "shutdown_grace_seconds": 600,  # longer than any test here: what ends a drain is what the test does
    "worker_processes": 1,
    "keyspace_events_configure": "false",
    # Shutdown must meet session end's own promotion: nothing learnt while the sessions were open.
    "learn_every_turns": 0,
    "learn_idle_seconds": 0,
}
# A poll's deadline: generous for a loaded machine (a condition met sooner ends the wait at once).
SETTLE_S = 300
WATCHERS = 32  # the default admission limit of WatchSessionEvents: every stream a sidecar keeps open


@pytest.fixture()
def prefix(redis_url: str) -> Iterator[str]:
    p = f"td{uuid.uuid4().hex[:10]}"
    yield p
    delete_prefix(redis_url, p)


@pytest.fixture()
def sidecars() -> Iterator[list[SidecarProcess | WorkerProcess]]:
    """The processes a test started (sidecars, and a `memlane worker`), stopped at its end."""
    running: list[SidecarProcess | WorkerProcess] = []
    yield running
    for p in running:
        p.stop()


def _long_session(c: memlane.Client, turns: int = 200) -> str:
    sid = c.create_session(user_id="u-drain", agent_id="a1").session.session_id
    for start in range(0, turns, 100):
        c.append_messages(
            session_id=sid,
            messages=[
                Message(role=Role.ROLE_USER, content=f"I work at company number {i} and I like colour {i}.")
                if i % 2 == 0
                else Message(role=Role.ROLE_ASSISTANT, content=f"Got it, note {i} saved.")
                for i in range(start, min(turns, start + 100))
            ],
        )
    return sid


def _closed(c: memlane.Client, sid: str) -> bool:
    """PromoteSession(close) closes the session first, then waits for its job: closed means in flight."""
    return c.get_session(session_id=sid).session.status == CLOSED


class _Call(threading.Thread):
    """A call made in a thread of its own: ``outcome`` holds its answer or its error once it ends."""

    def __init__(self, call: Any) -> None:
        super().__init__(daemon=True)
        self._call = call
        self.outcome: dict[str, Any] = {}
        self.start()

    def run(self) -> None:
        try:
            self.outcome["ok"] = self._call()
        except memlane.MemlaneError as exc:
            self.outcome["error"] = exc


def _refused(target: str, sid: str) -> bool:
    with memlane.Client(target, timeout=5, retry=memlane.NO_RETRY) as fresh:
        try:
            fresh.get_session(session_id=sid)
            return False
        except memlane.UnavailableError as exc:
            assert exc.reason == "SHUTTING_DOWN", exc
            return True


def _mid_promotion(r: Any, prefix: str, sid: str) -> bool:
    state = int(r.hget(KeySpace(prefix).session(sid).doc, "promotion_state") or 0)
    return state == PROMOTING and int(r.hget(KeySpace(prefix).pipeline(sid), "promoted_through") or 0) >= 5


def test_sigterm_refuses_new_calls_ends_watch_streams_and_finishes_the_one_in_flight(
    sidecars: list[SidecarProcess | WorkerProcess], prefix: str, redis_url: str, tmp_path: Path
) -> None:
    # A thin sidecar (no background jobs): its PromoteSession waits, whatever the machine's speed, until
    # the test starts a `memlane worker` to run the job. (Not a worker held with SIGSTOP: timers that
    # expired while it was stopped fire at once when it goes on, and can fail the run it resumes.)
    data = tmp_path / "shared"
    thin = {**SETTINGS, "pipeline_enabled": "false"}
    a = SidecarProcess(tmp_path, "a", redis_url, prefix, data, **thin)
    sidecars.append(a)
    with memlane.Client(a.target, timeout=600) as c:
        sid = _long_session(c, turns=40)
        with memlane.Client(a.target, timeout=600, retry=memlane.NO_RETRY) as w:
            seen: list[collections.Counter[str]] = []

            def watch() -> None:
                got = collections.Counter[str]()
                seen.append(got)
                # From the oldest retained event: a stream that opens after the close still sees it.
                for r in w.watch_session_events(user_id="u-drain", after_event_id="0"):
                    got[r.event.session_id] += 1

            watchers = [_Call(watch) for _ in range(WATCHERS)]
            # PromoteSession runs the session end inside the call: it closes the session (an event every
            # watcher sees, so all streams are open) and waits for its job, which nobody runs yet.
            call = _Call(lambda: c.promote_session(session_id=sid, close=True))
            wait_for(lambda: _closed(c, sid), timeout=SETTLE_S)
            wait_for(
                lambda: len(seen) == WATCHERS and all(got[sid] for got in seen),
                timeout=SETTLE_S,
                describe=lambda: f"{sum(bool(got[sid]) for got in seen)} of {WATCHERS} streams saw the close",
            )
            a.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: _refused(a.target, sid), timeout=SETTLE_S)
            # The watch streams end at once (the docs: a drain does not wait for them), while the call
            # is still in flight: they answer UNAVAILABLE with the reason, so a watcher resumes elsewhere.
            wait_for(
                lambda: not any(t.is_alive() for t in watchers),
                timeout=SETTLE_S,
                describe=lambda: f"{sum(t.is_alive() for t in watchers)} watch streams still open",
            )
            for t in watchers:
                error = t.outcome.get("error")
                assert isinstance(error, memlane.UnavailableError), t.outcome
                assert error.reason == "SHUTTING_DOWN", error
            assert call.is_alive()  # refused and ended while the promotion was still running ...
            sidecars.append(WorkerProcess(tmp_path, redis_url, prefix, data))
            call.join(SETTLE_S)
            assert "error" not in call.outcome, call.outcome
            assert call.outcome["ok"].session.promotion_state == ARCHIVED  # ... which finished and answered
    assert a.proc.wait(300) == 0


def test_a_call_whose_work_outlasts_the_grace_is_answered_unavailable_and_its_work_done_elsewhere(
    sidecars: list[SidecarProcess | WorkerProcess], prefix: str, redis_url: str, tmp_path: Path
) -> None:
    """The drain's promise for a call still running at the end of the grace period: UNAVAILABLE with the
    reason SHUTTING_DOWN (the client retries), not a GOAWAY; its job stays queued, so the retry on
    another sidecar (or this one restarted) finishes it, and the session ends once."""
    # A thin sidecar (no background jobs): its PromoteSession waits for a job nobody here runs.
    thin = {**SETTINGS, "pipeline_enabled": "false", "shutdown_grace_seconds": 1}
    a = SidecarProcess(tmp_path, "a", redis_url, prefix, tmp_path / "a", **thin)
    sidecars.append(a)
    with memlane.Client(a.target, timeout=600, retry=memlane.NO_RETRY) as c:
        sid = _long_session(c, turns=20)
        call = _Call(lambda: c.promote_session(session_id=sid, close=True))
        wait_for(lambda: _closed(c, sid), timeout=SETTLE_S)
        a.proc.send_signal(signal.SIGTERM)
        call.join(300)
    assert not call.is_alive()
    error = call.outcome.get("error")
    assert isinstance(error, memlane.UnavailableError), call.outcome
    assert error.reason == "SHUTTING_DOWN", error
    assert a.proc.wait(300) == 0
    b = SidecarProcess(tmp_path, "b", redis_url, prefix, tmp_path / "b", **SETTINGS)
    sidecars.append(b)
    with memlane.Client(b.target, timeout=600) as c:  # the client's retry, on another sidecar
        assert c.promote_session(session_id=sid, close=True).session.promotion_state == ARCHIVED
    r = redis_client(redis_url)

    def ended() -> collections.Counter[EventType]:
        return collections.Counter(t for t, s in _events(r, prefix) if s == sid)

    # The event is relayed just after the state change (the outbox): polled for, then counted.
    wait_for(lambda: ended()[EventType.ARCHIVED], timeout=SETTLE_S)
    assert ended()[EventType.ARCHIVED] == 1, ended()
    r.close()


def test_sigterm_hands_session_end_jobs_to_another_sidecar_at_once(
    sidecars: list[SidecarProcess | WorkerProcess], prefix: str, redis_url: str, tmp_path: Path
) -> None:
    a = SidecarProcess(tmp_path, "a", redis_url, prefix, tmp_path / "a", **SETTINGS)
    sidecars.append(a)
    r = redis_client(redis_url)
    with memlane.Client(a.target, timeout=60) as c:
        # 80 chunks of 5: seen mid-run at its first chunks, it is still running when SIGTERM comes.
        sid = _long_session(c, turns=400)
        c.close_session(session_id=sid)  # the end job goes to the queue; only a is there to take it
    wait_for(lambda: _mid_promotion(r, prefix, sid), timeout=SETTLE_S)
    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(300) == 0
    assert "handed a session-end job back" in a.log.read_text()  # a stopped mid-run and gave the job up
    # Only now a second sidecar: however long it takes to start, the job waits in the queue for it,
    # not for the claim timeout (10 minutes).
    b = SidecarProcess(tmp_path, "b", redis_url, prefix, tmp_path / "b", **SETTINGS)
    sidecars.append(b)
    wait_for(
        lambda: int(hget(r, KeySpace(prefix).session(sid).doc, "promotion_state") or 0) == ARCHIVED,
        timeout=SETTLE_S,
    )
    r.close()
