"""The session-end pipeline across real sidecar processes: discard, summarize, promote, archive, exactly
once with two sidecars sharing Redis, and to completion after a sidecar is SIGKILLed mid-promotion."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lancedb
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
import redis

import memlane
from memlane import Message, PromotionState, Role
from memlane_server.bench.runner import children_of
from memlane_server.keyspace import KeySpace
from memlane_server.ltm.schema import TABLE_NAME
from memlane_server.sessions.ending import GROUP
from memlane_server.sessions.events import EventType
from tests.conftest import ServerFactory, delete_prefix, hget, raw, redis_client, stream_entries, wait_for

ARCHIVED = PromotionState.PROMOTION_STATE_ARCHIVED
# A poll's deadline: generous for a loaded machine (a condition met sooner ends the wait at once).
SETTLE_S = 300


class SidecarProcess:
    """``memlane serve`` in its own process, on a Unix socket."""

    def __init__(
        self, tmp: Path, name: str, redis_url: str, prefix: str, data_dir: Path, **settings: Any
    ) -> None:
        self.sock = tmp / f"{name}.sock"
        self.log = tmp / f"{name}.log"
        args = [
            sys.executable,
            "-m",
            "memlane_server.cli",
            "serve",
            "--listen",
            f"unix:{self.sock}",
            "--admin-listen",
            "",
            "--redis-url",
            redis_url,
            "--key-prefix",
            prefix,
            "--data-dir",
            str(data_dir),
            "--log-format",
            "text",
        ]
        for key, value in settings.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMLANE_")}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.target = f"unix:{self.sock}"
        try:
            with memlane.Client(self.target, timeout=2) as c:
                wait_for(lambda: self._ready(c), timeout=SETTLE_S)
        except BaseException:
            self.kill()  # never ready: nobody else holds this process to stop it
            raise

    def _ready(self, c: memlane.Client) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"sidecar exited: {self.log.read_text()[-2000:]}")
        try:
            c.list_sessions(user_id="probe", page_size=1)
            return True
        except (memlane.UnavailableError, memlane.DeadlineExceededError):
            return False  # still starting; any other error is a real failure

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def workers(self) -> list[int]:
        """Its worker processes (``worker_processes``, default 1), once started: they run its jobs (its
        other children: the model process, an embedded Redis)."""

        def running() -> list[int]:
            return [p for p in children_of(self.proc.pid) if " worker " in cmdline(p)]

        return list(wait_for(running, timeout=SETTLE_S))


def cmdline(pid: int) -> str:
    """A process's command line, arguments joined by spaces ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # gone meanwhile
        return ""


def consumer_pids(r: redis.Redis, prefix: str) -> set[int]:
    """The process id in each consumer name of the job stream's group (``host-pid-hex``) of the processes
    that were delivered a job. Before Redis 7.2 a consumer is listed only once it was delivered one; from
    7.2 an empty read lists it too, with ``inactive`` -1 (no successful read yet), so those are left out:
    a worker that only polled has taken no job."""
    try:
        consumers = r.xinfo_consumers(KeySpace(prefix).session_end_queue(), GROUP)
    except redis.ResponseError:  # no queue or group yet: nobody has read
        return set()
    return {
        int((c["name"].decode() if isinstance(c["name"], bytes) else c["name"]).rsplit("-", 2)[1])
        for c in consumers
        if int(c.get("inactive", 0)) != -1
    }


@pytest.fixture()
def procs(redis_url: str) -> Iterator[list[SidecarProcess]]:
    running: list[SidecarProcess] = []
    yield running
    for p in running:
        p.stop()


@pytest.fixture()
def prefix(redis_url: str) -> Iterator[str]:
    p = f"tp{uuid.uuid4().hex[:10]}"
    yield p
    delete_prefix(redis_url, p)


def test_steps_discard_summarize_promote_archive(start_server: ServerFactory, user_id: str) -> None:
    srv = start_server()
    with memlane.Client(srv.target, timeout=30) as c:
        sid = c.create_session(user_id=user_id, agent_id="helper").session.session_id
        c.append_messages(
            session_id=sid,
            messages=[
                Message(role=Role.ROLE_USER, content="I live in Pune and I prefer metric units."),
                Message(role=Role.ROLE_ASSISTANT, content="Noted: Pune, metric."),
                Message(role=Role.ROLE_USER, content="scratch: card draft 4111", transient=True),
                Message(role=Role.ROLE_USER, content="Always answer in British English."),
                Message(role=Role.ROLE_ASSISTANT, content="Will do."),
            ],
        )
        first = c.promote_session(session_id=sid, close=True)
        assert first.session.promotion_state == ARCHIVED
        assert "Pune" in first.session.summary.text and "scratch" not in first.session.summary.text
        assert first.session.summary.through_seq == 5
        # The transient message left Redis; everything else is still hot until the hot retention.
        assert [m.seq for m in c.list_messages(session_id=sid).messages] == [1, 2, 4, 5]
        again = c.promote_session(session_id=sid)
        assert sorted(again.promoted_memory_ids) == sorted(first.promoted_memory_ids)
    items = _ltm_items(srv, sid)
    contents = {i["content"] for i in items}
    assert any("Pune" in t for t in contents) and any("British" in t for t in contents)
    assert not any("4111" in t or "scratch" in t for t in contents)
    assert {i["id"] for i in items} <= set(first.promoted_memory_ids)


def _ltm_items(srv: Any, sid: str) -> list[dict[str, Any]]:
    uri = srv.sidecar.settings.ltm.ltm_uri or str(Path(srv.sidecar.settings.server.data_dir) / "ltm")
    return _items_at(uri, sid)


def _items_at(uri: str, sid: str) -> list[dict[str, Any]]:
    table = lancedb.connect(uri).open_table(TABLE_NAME)
    rows = table.to_arrow().to_pylist()
    return [r for r in rows if r["source_session_id"] == sid]


def _events(r: redis.Redis, prefix: str) -> list[tuple[EventType, str]]:
    return [(EventType(int(f[b"t"])), f[b"s"].decode()) for f in stream_entries(r, KeySpace(prefix).events())]


def test_two_sidecar_processes_end_each_session_once(
    procs: list[SidecarProcess], prefix: str, redis_url: str, tmp_path: Path
) -> None:
    data = tmp_path / "shared"  # the archive is shared (as an s3:// root would be in production)
    common = {"ltm_enabled": "false", "lifecycle_sweep_interval_seconds": 0.2, "pipeline_concurrency": 4}
    procs.append(SidecarProcess(tmp_path, "a", redis_url, prefix, data, **common))
    procs.append(SidecarProcess(tmp_path, "b", redis_url, prefix, data, **common))
    r = redis_client(redis_url)
    workers = {pid for p in procs for pid in p.workers()}
    sids: list[str] = []

    def sessions(n: int) -> None:  # each expires a second after its last message: a job for either
        for _ in range(n):
            i = len(sids)
            with memlane.Client(procs[i % 2].target, timeout=10) as c:
                sid = c.create_session(user_id=f"u{i % 3}", ttl_seconds=1).session.session_id
                c.append_messages(
                    session_id=sid, messages=[Message(role=Role.ROLE_USER, content=f"hello {i}")]
                )
                sids.append(sid)

    # Which worker wins a job is a race; that both take jobs is made certain: once one worker has taken
    # a job it is held (SIGSTOP) while the second half is queued, which it cannot take but for the one
    # read it may have had waiting (at most pipeline_concurrency jobs), so the other worker takes the rest.
    sessions(15)
    first = next(iter(wait_for(lambda: consumer_pids(r, prefix), timeout=SETTLE_S)))
    os.kill(first, signal.SIGSTOP)
    try:
        sessions(15)
        wait_for(lambda: consumer_pids(r, prefix) - {first}, timeout=SETTLE_S)
    finally:
        os.kill(first, signal.SIGCONT)
    wait_for(
        lambda: all(
            int(hget(r, KeySpace(prefix).session(s).doc, "promotion_state") or 0) == ARCHIVED for s in sids
        ),
        SETTLE_S,
    )
    # An event is relayed just after its state change (the outbox): polled for, then counted.
    ends = [(t, s) for s in sids for t in (EventType.EXPIRED, EventType.ARCHIVED)]

    def relayed() -> collections.Counter[tuple[EventType, str]] | None:
        got = collections.Counter(_events(r, prefix))
        return got if all(got[e] for e in ends) else None

    counts = wait_for(relayed, timeout=SETTLE_S)
    for sid in sids:
        assert counts[(EventType.EXPIRED, sid)] == 1
        assert counts[(EventType.ARCHIVED, sid)] == 1
    files = [
        f.path for f in ds.dataset(str(data / "archive" / "transcripts"), format="parquet").get_fragments()
    ]
    assert sorted(Path(f).name.split(".")[0] for f in files) == sorted(sids)
    queue = KeySpace(prefix).session_end_queue()
    # Every job acknowledged (a run acknowledges its job just after the session is archived).
    wait_for(
        lambda: not r.xpending(queue, GROUP)["pending"],
        timeout=SETTLE_S,
        describe=lambda: str(r.xpending_range(queue, GROUP, "-", "+", 10)),
    )
    assert consumer_pids(r, prefix) == workers  # both sidecars' workers took jobs from the one queue
    r.close()


def test_sigkill_mid_promotion_then_restart_completes(
    procs: list[SidecarProcess], prefix: str, redis_url: str, tmp_path: Path
) -> None:
    data = tmp_path / "node"
    settings = {
        "pipeline_chunk_messages": 10,
        "pipeline_claim_timeout_seconds": 2,
        "keyspace_events_configure": "false",
        # The crash must land in session end's own promotion: nothing learnt while the session was open.
        "learn_every_turns": 0,
        "learn_idle_seconds": 0,
    }
    procs.append(SidecarProcess(tmp_path, "first", redis_url, prefix, data, **settings))
    n = 400
    with memlane.Client(procs[0].target, timeout=30) as c:
        sid = c.create_session(user_id="crash-user", agent_id="a1").session.session_id
        for start in range(0, n, 100):
            c.append_messages(
                session_id=sid,
                messages=[
                    Message(
                        role=Role.ROLE_USER, content=f"I work at company number {i} and I like colour {i}."
                    )
                    if i % 2 == 0
                    else Message(role=Role.ROLE_ASSISTANT, content=f"Got it, note {i} saved.")
                    for i in range(start, start + 100)
                ],
            )
        c.close_session(session_id=sid)
    r = redis_client(redis_url)
    doc, state = KeySpace(prefix).session(sid).doc, KeySpace(prefix).pipeline(sid)

    def mid_promotion() -> bool:
        promoting = int(hget(r, doc, "promotion_state") or 0) == PromotionState.PROMOTION_STATE_PROMOTING
        return promoting and int(hget(r, state, "promoted_through") or 0) >= 60

    wait_for(mid_promotion, timeout=60)
    procs[0].kill()
    through = int(hget(r, state, "promoted_through") or 0)
    assert 60 <= through < n, through
    assert int(hget(r, doc, "promotion_state") or 0) == PromotionState.PROMOTION_STATE_PROMOTING

    procs.append(SidecarProcess(tmp_path, "second", redis_url, prefix, data, **settings))
    wait_for(lambda: int(hget(r, doc, "promotion_state") or 0) == ARCHIVED, timeout=60)

    items = _items_at(str(data / "ltm"), sid)
    ids = [i["id"] for i in items]
    assert len(ids) == len(set(ids))
    episodes = [i for i in items if i["kind"] == "episodic"]
    firsts = [i["source_message_ids"][0] for i in episodes]
    assert len(firsts) == len(set(firsts)) == n  # one episode per spoken turn, none twice
    facts = [(i["kind"], i["content"]) for i in items if i["kind"] != "episodic"]
    assert len(facts) == len(set(facts))
    promoted = {raw(m).decode() for m in r.smembers(KeySpace(prefix).promoted(sid))}
    assert set(ids) <= promoted

    # A session without a channel sits in Hive's null partition, whose type cannot be inferred alone.
    hive = ds.partitioning(pa.schema([("date", pa.string()), ("channel", pa.string())]), flavor="hive")
    rows = (
        ds.dataset(str(data / "archive" / "transcripts"), format="parquet", partitioning=hive)
        .to_table(filter=ds.field("session_id") == sid)
        .to_pylist()
    )
    assert sorted(row["seq"] for row in rows) == list(range(1, n + 1))
    r.close()
