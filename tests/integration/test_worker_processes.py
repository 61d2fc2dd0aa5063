"""Serving apart from work, with real processes: ``memlane serve`` runs its background jobs in worker
processes it starts (``worker_processes``), ``memlane worker`` runs them alone for thin sidecars, a worker
killed mid-job is replaced and its session still ends once, and serving answers while a worker
grinds through a hostile session."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import memlane
from memlane import Message, PromotionState, Role
from memlane_server.bench.runner import children_of
from memlane_server.keyspace import KeySpace
from tests.conftest import delete_prefix, hget, redis_client, wait_for
from tests.integration.test_session_end_pipeline import SidecarProcess, cmdline, consumer_pids

ARCHIVED = PromotionState.PROMOTION_STATE_ARCHIVED
PROMOTING = PromotionState.PROMOTION_STATE_PROMOTING
PROBE_ROUNDS = 100  # health probe + append pairs made while the worker grinds
QUIET = {"keyspace_events_configure": "false", "learn_every_turns": 0, "learn_idle_seconds": 0}


@pytest.fixture()
def prefix(redis_url: str) -> Iterator[str]:
    p = f"tw{uuid.uuid4().hex[:10]}"
    yield p
    delete_prefix(redis_url, p)


@pytest.fixture()
def processes() -> Iterator[list[Any]]:
    running: list[Any] = []
    yield running
    for p in running:
        p.stop()


def _children(pid: int) -> set[int]:
    return set(children_of(pid))


def _workers(pid: int) -> set[int]:
    """The worker processes among ``pid``'s children (beside them: the model process)."""
    return {p for p in children_of(pid) if " worker " in cmdline(p)}


def _session(c: memlane.Client, user: str, turns: int = 20) -> str:
    sid = c.create_session(user_id=user, agent_id="a1").session.session_id
    c.append_messages(
        session_id=sid,
        messages=[
            Message(role=Role.ROLE_USER, content=f"I moved to Lisbon and my badge number is B-{i}.")
            if i % 2 == 0
            else Message(role=Role.ROLE_ASSISTANT, content="Noted.")
            for i in range(turns)
        ],
    )
    return sid


def _state(r: Any, prefix: str, sid: str) -> int:
    return int(hget(r, KeySpace(prefix).session(sid).doc, "promotion_state") or 0)


@pytest.mark.parametrize("workers", [1, 0])
def test_session_end_runs_in_a_worker_process(
    processes: list[Any], prefix: str, redis_url: str, tmp_path: Path, workers: int
) -> None:
    """With worker processes the serving process takes no job; with 0 it runs them itself (control)."""
    a = SidecarProcess(tmp_path, "a", redis_url, prefix, tmp_path / "a", worker_processes=workers, **QUIET)
    processes.append(a)
    r = redis_client(redis_url)
    with memlane.Client(a.target, timeout=60) as c:
        sid = _session(c, "u-split")
        out = c.promote_session(session_id=sid, close=True)
        assert out.session.promotion_state == ARCHIVED
        assert out.promoted_memory_ids  # the facts went to long-term memory, and the call saw them
        assert c.search_memories(
            caller=memlane.Caller(user_id="u-split", agent_id="a1"), query="where did I move?"
        ).results
    pids = consumer_pids(r, prefix)
    if workers:
        assert a.proc.pid not in pids
        assert pids <= _children(a.proc.pid)
        # One model per pod: the worker promoted and the serving process recalled through the model
        # process; neither loaded ONNX Runtime (the model process did: the check's positive control).
        kids = _children(a.proc.pid)
        (model,) = [p for p in kids if cmdline(p).find("memlane_server.children") >= 0]
        (worker,) = _workers(a.proc.pid)
        assert _maps_onnxruntime(model)
        assert not _maps_onnxruntime(worker) and not _maps_onnxruntime(a.proc.pid)
    else:
        assert pids == {a.proc.pid}
    r.close()


def _maps_onnxruntime(pid: int) -> bool:
    return "onnxruntime" in Path(f"/proc/{pid}/maps").read_text()


def test_a_killed_worker_is_replaced_and_its_session_ends_once(
    processes: list[Any], prefix: str, redis_url: str, tmp_path: Path
) -> None:
    a = SidecarProcess(
        tmp_path,
        "a",
        redis_url,
        prefix,
        tmp_path / "a",
        pipeline_chunk_messages=5,
        pipeline_claim_timeout_seconds=3,
        **QUIET,
    )
    processes.append(a)
    r = redis_client(redis_url)
    with memlane.Client(a.target, timeout=60) as c:
        sid = _session(c, "u-kill", turns=400)
        c.close_session(session_id=sid)
        key = KeySpace(prefix).pipeline(sid)
        wait_for(lambda: int(hget(r, key, "promoted_through") or 0) >= 5, timeout=120)
        (worker,) = _workers(a.proc.pid)
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: _state(r, prefix, sid) == ARCHIVED, timeout=180)
        assert "a worker process exited; starting it again" in a.log.read_text()
        replacement = wait_for(lambda: _workers(a.proc.pid) - {worker}, timeout=30)
        assert replacement
        parts = json.loads(hget(r, key, "archives") or b"[]")
        assert len(parts) == 1  # ended once: one archive part, not one per run
    r.close()


class WorkerProcess:
    """``memlane worker`` in its own process, against a thin sidecar's Redis and data dir."""

    def __init__(self, tmp: Path, redis_url: str, prefix: str, data_dir: Path) -> None:
        self.log = tmp / "worker.log"
        args = [
            sys.executable,
            "-m",
            "memlane_server.cli",
            "worker",
            "--redis-url",
            redis_url,
            "--key-prefix",
            prefix,
            "--data-dir",
            str(data_dir),
            "--admin-listen",
            "",
            "--log-format",
            "text",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMLANE_")}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def test_memlane_worker_runs_a_thin_sidecars_jobs(
    processes: list[Any], prefix: str, redis_url: str, tmp_path: Path
) -> None:
    data = tmp_path / "shared"
    thin = SidecarProcess(tmp_path, "thin", redis_url, prefix, data, pipeline_enabled="false", **QUIET)
    processes.append(thin)
    r = redis_client(redis_url)
    with memlane.Client(thin.target, timeout=60) as c:
        sid = _session(c, "u-thin")
        c.close_session(session_id=sid)
        # Control: nobody here takes the job. No worker process, and (below) the only consumer the
        # queue ever delivered to is the `memlane worker` started next; no wait needed to show it.
        assert not _children(thin.proc.pid)
        worker = WorkerProcess(tmp_path, redis_url, prefix, data)
        processes.append(worker)
        wait_for(lambda: _state(r, prefix, sid) == ARCHIVED, timeout=120)
        assert consumer_pids(r, prefix) == {worker.proc.pid}
        assert c.search_memories(
            caller=memlane.Caller(user_id="u-thin", agent_id="a1"), query="badge number"
        ).results
    worker.stop()
    assert worker.proc.returncode == 0
    r.close()


def test_memlane_worker_refuses_to_start_without_a_redis_url(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "memlane_server.cli", "worker", "--data-dir", str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("MEMLANE_")},
    )
    assert out.returncode == 2
    assert "memlane worker needs redis_url" in out.stderr


def _healthz(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert b" 200 " in s.recv(200)


def test_serving_answers_at_once_while_a_worker_grinds_through_a_hostile_session(
    processes: list[Any], prefix: str, redis_url: str, tmp_path: Path
) -> None:
    """A 120 KB turn and ten ordinary sessions are promoted by the worker; meanwhile every health probe
    and every append of another session is answered at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        admin = s.getsockname()[1]
    a = SidecarProcess(
        tmp_path, "a", redis_url, prefix, tmp_path / "a", admin_listen=f"127.0.0.1:{admin}", **QUIET
    )
    processes.append(a)
    r = redis_client(redis_url)
    with memlane.Client(a.target, timeout=60) as c:
        hostile = c.create_session(user_id="u-hostile", agent_id="a1").session.session_id
        c.append_messages(
            session_id=hostile,
            messages=[
                Message(role=Role.ROLE_USER, content="a." * 60000),
                Message(role=Role.ROLE_ASSISTANT, content="Noted."),
            ],
        )
        ordinary = [_session(c, f"u-ord{i}") for i in range(10)]
        live = c.create_session(user_id="u-live", agent_id="a1").session.session_id
        for sid in [hostile, *ordinary]:
            c.close_session(session_id=sid)
        # How fast serving answers meanwhile is the bench's isolation row (bench/processes.py), not a
        # bound here: here every probe and append is answered, while the worker is busy.
        rounds = busy = 0

        def probe() -> bool:
            nonlocal rounds, busy
            _healthz(admin)
            c.append_messages(
                session_id=live, messages=[Message(role=Role.ROLE_USER, content=f"hi {rounds}")]
            )
            rounds += 1
            busy += any(_state(r, prefix, sid) == PROMOTING for sid in [hostile, *ordinary])
            return rounds >= PROBE_ROUNDS and busy > 0

        # Positive control: probing goes on until the worker has been seen promoting (it may still be
        # starting: loading the model takes what the machine gives it).
        wait_for(probe, timeout=300, describe=lambda: f"{rounds} rounds, worker seen busy in {busy}")
    r.close()


def _get(port: int, path: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0]
    return body.decode()


def test_the_serving_process_serves_its_workers_metrics(
    processes: list[Any], prefix: str, redis_url: str, tmp_path: Path
) -> None:
    """One scrape target: the session end ran in a worker, and its pipeline metrics are on serve's
    /metrics, labelled with the worker, with no family repeated."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        admin = s.getsockname()[1]
    a = SidecarProcess(
        tmp_path, "a", redis_url, prefix, tmp_path / "a", admin_listen=f"127.0.0.1:{admin}", **QUIET
    )
    processes.append(a)
    with memlane.Client(a.target, timeout=60) as c:
        before = _get(admin, "/metrics")
        assert 'memlane_pipeline_step_duration_seconds_count{step="promote"' not in before  # control
        c.promote_session(session_id=_session(c, "u-metrics"), close=True)
    text = _get(admin, "/metrics")
    families = [f.name for f in text_string_to_metric_families(text)]
    assert len(families) == len(set(families))
    promote = [
        s
        for f in text_string_to_metric_families(text)
        if f.name == "memlane_pipeline_step_duration_seconds"
        for s in f.samples
        if s.name.endswith("_count") and s.labels.get("step") == "promote"
    ]
    assert promote and {s.labels.get("worker") for s in promote} == {"0"}
    assert sum(s.value for s in promote) >= 1


def test_a_search_sees_what_a_worker_just_promoted(
    processes: list[Any], prefix: str, redis_url: str, tmp_path: Path
) -> None:
    """The serving process read the user's memories before the worker wrote (its view cached); the
    search after the session end still finds the new facts: the version token says the view is old."""
    a = SidecarProcess(tmp_path, "a", redis_url, prefix, tmp_path / "a", **QUIET)
    processes.append(a)
    who = memlane.Caller(user_id="u-fresh", agent_id="a1")
    with memlane.Client(a.target, timeout=60) as c:
        c.create_memory(caller=who, kind=memlane.MemoryKind.MEMORY_KIND_FACT, content="User plays the cello.")
        before = c.search_memories(caller=who, query="where did the user move?", limit=10).results
        assert not any("Lisbon" in h.memory.content for h in before)  # read (and cached) before the write
        c.promote_session(session_id=_session(c, "u-fresh"), close=True)
        after = c.search_memories(caller=who, query="where did the user move?", limit=10).results
        assert any("Lisbon" in h.memory.content for h in after), [h.memory.content for h in after]


def test_a_killed_model_process_is_replaced_and_vectors_flow_again(
    processes: list[Any], prefix: str, redis_url: str, tmp_path: Path
) -> None:
    """The pod's one model dies (kill -9): it is started again on the same socket, and the serving
    process's recall and a worker's promotion embed through the new one."""
    a = SidecarProcess(tmp_path, "a", redis_url, prefix, tmp_path / "a", **QUIET)
    processes.append(a)
    who = memlane.Caller(user_id="u-model", agent_id="a1")
    with memlane.Client(a.target, timeout=60) as c:
        c.create_memory(caller=who, kind=memlane.MemoryKind.MEMORY_KIND_FACT, content="Dana keeps bees.")
        assert c.search_memories(caller=who, query="who keeps bees?").results  # positive control
        (model,) = [p for p in _children(a.proc.pid) if "memlane_server.children" in cmdline(p)]
        os.kill(model, signal.SIGKILL)
        wait_for(lambda: "the model process exited; starting it again" in a.log.read_text(), timeout=30)
        hits = c.search_memories(caller=who, query="who keeps bees?").results  # waits for the new one
        assert hits and hits[0].memory.content == "Dana keeps bees."
        out = c.promote_session(session_id=_session(c, "u-model"), close=True)
        assert out.session.promotion_state == ARCHIVED and out.promoted_memory_ids
    (new,) = [p for p in _children(a.proc.pid) if "memlane_server.children" in cmdline(p)]
    assert new != model
