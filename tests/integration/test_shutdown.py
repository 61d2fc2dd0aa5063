"""SIGTERM drains a real ``memlane serve`` process: new calls are refused, the call in flight finishes
within the grace period, and session-end jobs go back to the queue so another sidecar takes them at once
(not after the claim timeout, here 10 minutes)."""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import memlane
from memlane import Message, PromotionState, Role
from memlane_server.sessions.keys import KeySpace
from tests.conftest import delete_prefix, hget, redis_client, wait_for
from tests.integration.test_session_end_pipeline import SidecarProcess

ARCHIVED = PromotionState.PROMOTION_STATE_ARCHIVED
PROMOTING = PromotionState.PROMOTION_STATE_PROMOTING
SETTINGS = {
    "pipeline_chunk_messages": 5,
    "pipeline_claim_timeout_seconds": 600,  # without a hand-back nobody could take a job for 10 minutes
    "shutdown_grace_seconds": 120,
    "keyspace_events_configure": "false",
    # Shutdown must meet session end's own promotion: nothing learnt while the sessions were open.
    "learn_every_turns": 0,
    "learn_idle_seconds": 0,
}


@pytest.fixture()
def prefix(redis_url: str) -> Iterator[str]:
    p = f"td{uuid.uuid4().hex[:10]}"
    yield p
    delete_prefix(redis_url, p)


@pytest.fixture()
def sidecars() -> Iterator[list[SidecarProcess]]:
    running: list[SidecarProcess] = []
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
                for i in range(start, start + 100)
            ],
        )
    return sid


def _mid_promotion(r: Any, prefix: str, sid: str) -> bool:
    state = int(r.hget(KeySpace(prefix).session(sid).doc, "promotion_state") or 0)
    return state == PROMOTING and int(r.hget(KeySpace(prefix).pipeline(sid), "promoted_through") or 0) >= 5


def test_sigterm_refuses_new_calls_and_finishes_the_one_in_flight(
    sidecars: list[SidecarProcess], prefix: str, redis_url: str, tmp_path: Path
) -> None:
    a = SidecarProcess(tmp_path, "a", redis_url, prefix, tmp_path / "a", **SETTINGS)
    sidecars.append(a)
    r = redis_client(redis_url)
    with memlane.Client(a.target, timeout=300) as c:
        sid = _long_session(c)
        outcome: dict[str, Any] = {}

        def promote() -> None:  # PromoteSession runs the whole pipeline inside the call
            try:
                outcome["ok"] = c.promote_session(session_id=sid, close=True)
            except memlane.MemlaneError as exc:
                outcome["error"] = exc

        call = threading.Thread(target=promote)
        call.start()
        wait_for(lambda: _mid_promotion(r, prefix, sid), timeout=120)
        a.proc.send_signal(signal.SIGTERM)

        def refused() -> bool:
            with memlane.Client(a.target, timeout=5, retry=memlane.NO_RETRY) as fresh:
                try:
                    fresh.get_session(session_id=sid)
                    return False
                except memlane.UnavailableError:
                    return True

        wait_for(refused, timeout=30)
        assert call.is_alive()  # refused while the promotion was still running ...
        call.join(150)
        assert "error" not in outcome, outcome
        assert outcome["ok"].session.promotion_state == ARCHIVED  # ... which finished and answered
    assert a.proc.wait(150) == 0
    r.close()


def test_sigterm_hands_session_end_jobs_to_another_sidecar_at_once(
    sidecars: list[SidecarProcess], prefix: str, redis_url: str, tmp_path: Path
) -> None:
    a = SidecarProcess(tmp_path, "a", redis_url, prefix, tmp_path / "a", **SETTINGS)
    sidecars.append(a)
    r = redis_client(redis_url)
    with memlane.Client(a.target, timeout=60) as c:
        sid = _long_session(c, turns=1000)  # long enough to still run once b is up
        c.close_session(session_id=sid)  # the end job goes to the queue; only a is there to take it
    wait_for(lambda: _mid_promotion(r, prefix, sid), timeout=120)
    b = SidecarProcess(tmp_path, "b", redis_url, prefix, tmp_path / "b", **SETTINGS)
    sidecars.append(b)
    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(150) == 0
    assert "handed a session-end job back" in a.log.read_text()  # a stopped mid-run and gave the job up
    wait_for(
        lambda: int(hget(r, KeySpace(prefix).session(sid).doc, "promotion_state") or 0) == ARCHIVED,
        timeout=240,
    )
    r.close()
