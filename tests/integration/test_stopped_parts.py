"""Parts of the pod that stop without dying, through real ``memlane serve`` processes (embedded Redis,
worker processes, the model process): a SIGSTOPped worker is killed and replaced and the sessions it held
still end; a SIGSTOPped model process costs a recall a second or two (UNAVAILABLE with a retry hint), not
the caller's deadline, and is replaced; a model process that keeps dying is named by health meanwhile.
Positive controls: a healthy pod stays SERVING, and a session end that runs longer than the stall bound
(but makes progress) is not killed. docs/reliability.md, "Parts that stop without dying"."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import memlane
from memlane import Message, PromotionState, Role
from memlane.v1 import memory_pb2 as mpb
from memlane_server.bench.runner import children_of
from tests.conftest import wait_for
from tests.integration.test_metrics import sample
from tests.integration.test_pod_faults import NOT_SERVING, SERVING, Pod, _cmdline, redis_servers_in

ARCHIVED = PromotionState.PROMOTION_STATE_ARCHIVED
QUIET = {"keyspace_events_configure": "false", "learn_every_turns": 0, "learn_idle_seconds": 0}
STALL_S = 3.0  # child_stall_seconds of these pods: small, so a test waits seconds, not minutes


@pytest.fixture()
def pods(tmp_path: Path) -> Iterator[list[Pod]]:
    running: list[Pod] = []
    yield running
    for p in running:
        for pid in children_of(p.proc.pid):  # a stopped child the change under test left stopped
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        p.stop()
    for pid in redis_servers_in(tmp_path / "data"):
        for sig in (signal.SIGKILL, signal.SIGCONT):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def pod(pods: list[Pod], tmp_path: Path, **settings: Any) -> Pod:
    settings = {"worker_processes": 1, "child_stall_seconds": STALL_S, **QUIET, **settings}
    p = Pod(tmp_path, "a", tmp_path / "data", **settings)
    pods.append(p)
    # Every part serves (a part stopped before its first sign of life gets FIRST_BEAT_S, not the bound).
    wait_for(lambda: metric(p, "memlane_part_up", part="worker-0") == 1, timeout=120)
    return p


def cli_health(p: Pod) -> subprocess.CompletedProcess[str]:
    """``memlane health`` against the pod: its status line, then one line per reason."""
    cmd = [sys.executable, "-m", "memlane_server.cli", "health", "--target", p.target]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)


def workers(p: Pod) -> list[int]:
    return [c for c in children_of(p.proc.pid) if " worker " in _cmdline(c)]


def model(p: Pod) -> int | None:
    found = [c for c in children_of(p.proc.pid) if "memlane_server.children" in _cmdline(c)]
    return found[0] if found else None


def metric(p: Pod, name: str, **labels: str) -> float:
    """One series of the pod's scrape, by its exact labels; 0 when absent."""
    return sample(p.http("/metrics")[1], name, **labels) or 0.0


def session(c: memlane.Client, user: str, turns: int) -> str:
    sid = c.create_session(user_id=user, agent_id="a1").session.session_id
    messages = [
        Message(role=Role.ROLE_USER, content=f"I moved to Lisbon in year {2000 + i} and badge B-{i}.")
        if i % 2 == 0
        else Message(role=Role.ROLE_ASSISTANT, content="Noted, thanks.")
        for i in range(turns)
    ]
    for at in range(0, turns, 100):
        c.append_messages(session_id=sid, messages=messages[at : at + 100])
    return sid


def archived(c: memlane.Client, sid: str) -> bool:
    return bool(c.get_session(session_id=sid).session.promotion_state == ARCHIVED)


def test_a_stopped_worker_is_killed_and_replaced_and_the_sessions_it_held_end(
    pods: list[Pod], tmp_path: Path
) -> None:
    """On 3af1f4b: 0 of 3 sessions ended in 90 s with their only worker SIGSTOPped, health said SERVING,
    nothing was logged or counted. Now the worker is SIGKILLed after ``child_stall_seconds`` of silence,
    health names it until its replacement serves, and every session ends once."""
    p = pod(pods, tmp_path, pipeline_claim_timeout_seconds=3)
    with memlane.Client(p.target, timeout=30) as c:
        sids = [session(c, f"u-stop-{i}", turns=20) for i in range(3)]
        (stopped,) = wait_for(lambda: workers(p), timeout=60)
        os.kill(stopped, signal.SIGSTOP)
        closed_at = time.monotonic()
        for sid in sids:
            c.close_session(session_id=sid)

        def named() -> str | None:
            status, body = p.http("/readyz")
            return body if status == 503 and "worker process 0" in body else None

        body = wait_for(named, timeout=STALL_S * 4)
        assert p.grpc_health() == NOT_SERVING
        said = cli_health(p)
        assert said.returncode == 1 and "worker process 0" in said.stdout, said
        wait_for(lambda: stopped not in workers(p) and workers(p), timeout=STALL_S * 4)
        wait_for(lambda: all(archived(c, sid) for sid in sids), timeout=90)
        ended_s = time.monotonic() - closed_at
        wait_for(lambda: p.grpc_health() == SERVING, timeout=30)
    log = p.log.read_text()
    assert "a worker process gave no sign of life" in log
    assert metric(p, "memlane_part_restarts_total", part="worker-0", cause="stalled") == 1
    assert metric(p, "memlane_part_up", part="worker-0") == 1
    print(
        f"stopped worker: readyz said {body.splitlines()[1]!r}; 3 of 3 sessions ended {ended_s:.1f} s "
        "after their close"
    )


def test_a_slow_job_that_makes_progress_is_not_killed_and_the_pod_stays_serving(
    pods: list[Pod], tmp_path: Path
) -> None:
    """Positive control: a session end that takes several times the stall bound (400 turns promoted
    in chunks of 5, embedded in bulk through the model process) runs to its end in the same worker,
    and health says SERVING throughout."""
    p = pod(pods, tmp_path, ltm_enabled="true", pipeline_chunk_messages=5, child_stall_seconds=2)
    with memlane.Client(p.target, timeout=60) as c:
        sid = session(c, "u-slow", turns=400)
        (worker,) = wait_for(lambda: workers(p), timeout=60)
        embedder = model(p)
        c.close_session(session_id=sid)
        closed_at = time.monotonic()
        health = []
        while not archived(c, sid):
            assert time.monotonic() - closed_at < 180, "the session did not end"
            health.append(p.grpc_health())
            time.sleep(0.5)
        took = time.monotonic() - closed_at
    assert took > 2 * 2, f"the job took {took:.1f} s: not slow enough to be a control"
    assert set(health) == {SERVING}, health
    assert workers(p) == [worker] and model(p) == embedder  # neither was killed
    assert "gave no sign of life" not in p.log.read_text()
    assert metric(p, "memlane_part_up", part="worker-0") == 1
    assert metric(p, "memlane_part_up", part="model") == 1
    print(f"slow job: {took:.1f} s against a 2 s stall bound, not killed")


def recall(c: memlane.Client, query: str) -> tuple[float, BaseException | None]:
    caller = mpb.Caller(user_id="u-recall", agent_id="a1")
    started = time.monotonic()
    try:
        c.search_memories(caller=caller, query=query)
    except memlane.MemlaneError as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def test_a_stopped_model_process_fails_recall_fast_and_is_replaced(pods: list[Pod], tmp_path: Path) -> None:
    """On 3af1f4b: with the model process SIGSTOPped every recall hung to the client's deadline (8 s) and
    /readyz said 200 throughout. Now a recall gets UNAVAILABLE with a retry hint within
    ``embedding_call_timeout_seconds`` (1 s here), health names the model process, and a fresh one
    answers within seconds."""
    p = pod(pods, tmp_path, ltm_enabled="true", embedding_call_timeout_seconds=1)
    with memlane.Client(p.target, timeout=8, retry=memlane.NO_RETRY) as c:
        c.create_memory(
            caller=mpb.Caller(user_id="u-recall", agent_id="a1"),
            kind=mpb.MEMORY_KIND_PREFERENCE,
            content="Prefers window seats.",
        )
        took, failed = recall(c, "which seat?")  # control: a live model answers
        assert failed is None
        stopped = wait_for(lambda: model(p), timeout=30)
        os.kill(stopped, signal.SIGSTOP)
        outcomes = [recall(c, f"which seat, take {i}? {uuid.uuid4().hex}") for i in range(3)]
        for took, exc in outcomes:
            assert isinstance(exc, memlane.UnavailableError), exc
            assert exc.retry_after is not None and exc.reason == "EMBEDDING_UNAVAILABLE"
            assert took < 2.5, f"a recall waited {took:.1f} s on a stopped model process"

        def named() -> str | None:
            status, body = p.http("/readyz")
            return body if status == 503 and "model process" in body else None

        body = wait_for(named, timeout=STALL_S * 3)
        wait_for(lambda: model(p) not in (None, stopped), timeout=STALL_S * 4)
        wait_for(lambda: recall(c, f"window? {uuid.uuid4().hex}")[1] is None, timeout=60)
        wait_for(lambda: p.grpc_health() == SERVING, timeout=30)
    assert metric(p, "memlane_part_restarts_total", part="model", cause="stalled") == 1
    slowest = max(t for t, _ in outcomes)
    print(f"stopped model: recall failed in at most {slowest:.2f} s; readyz said {body.splitlines()[1]!r}")


def test_a_model_process_that_keeps_dying_is_named_by_health(pods: list[Pod], tmp_path: Path) -> None:
    """On 3af1f4b: the model process killed in a loop left the pod without recall for 15 s while health
    said SERVING. Now health is NOT_SERVING, naming it, while it is down or starting again; recall fails
    fast meanwhile; once it is left alone it serves and health is SERVING again."""
    p = pod(pods, tmp_path, ltm_enabled="true", embedding_call_timeout_seconds=1)
    with memlane.Client(p.target, timeout=8, retry=memlane.NO_RETRY) as c:
        wait_for(lambda: model(p), timeout=30)
        assert p.grpc_health() == SERVING  # control: a healthy pod
        kills, seen, slowest = 0, set(), 0.0
        until = time.monotonic() + 12
        while time.monotonic() < until:
            pid = model(p)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    kills += 1
            seen.add(p.grpc_health())
            took, exc = recall(c, f"seat? {uuid.uuid4().hex}")
            slowest = max(slowest, took)
            assert exc is None or isinstance(exc, memlane.UnavailableError), exc
            time.sleep(0.2)
        status, body = p.http("/readyz")
        assert status == 503 and "the model process" in body, body
        said = cli_health(p)
        assert said.returncode == 1 and "the model process" in said.stdout, said
        assert kills >= 2 and NOT_SERVING in seen
        assert slowest < 2.5, f"a recall waited {slowest:.1f} s on a model process that keeps dying"
        wait_for(lambda: p.grpc_health() == SERVING, timeout=90)
        assert recall(c, "seat?")[1] is None
    assert metric(p, "memlane_part_restarts_total", part="model", cause="exited") >= 2
    print(f"restart loop: {kills} kills in 12 s, recall failed in at most {slowest:.2f} s")
