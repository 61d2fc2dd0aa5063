"""Restarts lose nothing that was acknowledged: the sidecar's, the embedded Redis's, and Redis's own."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

import memlane
from memlane import Message, Role
from memlane.v1 import context_pb2 as cpb
from memlane_server.infra.redis_server import server_binary
from tests.conftest import ServerFactory, wait_for


def _ids(client: memlane.Client, sid: str) -> list[str]:
    pages = memlane.iter_pages(
        lambda t: client.list_messages(session_id=sid, page_size=500, page_token=t), "messages"
    )
    return [m.message_id for m in pages]


def test_sidecar_restart_keeps_sessions(start_server: ServerFactory, user_id: str) -> None:
    first = start_server(key_prefix=f"rs{user_id}")
    with memlane.Client(first.target) as c:
        sid = c.create_session(user_id=user_id).session.session_id
        c.append_messages(
            session_id=sid, messages=[Message(role=Role.ROLE_USER, content=f"m{i}") for i in range(10)]
        )
    first.stop()
    second = start_server(key_prefix=f"rs{user_id}")
    with memlane.Client(second.target) as c:
        doc = c.get_session(session_id=sid).session
        assert doc.message_count == 10
        assert [m.content for m in c.list_messages(session_id=sid).messages] == [f"m{i}" for i in range(10)]


def test_embedded_redis_persists_across_restarts(
    start_server: ServerFactory, tmp_path: Path, user_id: str
) -> None:
    data = tmp_path / "data"
    first = start_server(redis_url="", data_dir=str(data), key_prefix="emb")
    assert first.sidecar.settings.redis.redis_url == ""
    with memlane.Client(first.target) as c:
        sid = c.create_session(user_id=user_id).session.session_id
        c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="remember me")])
    first.stop()
    assert (data / "redis" / "appendonlydir").exists() or (data / "redis" / "appendonly.aof").exists()
    second = start_server(redis_url="", data_dir=str(data), key_prefix="emb")
    with memlane.Client(second.target) as c:
        assert [m.content for m in c.list_messages(session_id=sid).messages] == ["remember me"]
    second.stop()


class _Redis:
    """A private redis-server with fsync on every write, so a crash loses nothing it acknowledged."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.sock = directory / "r.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                server_binary(),
                "--port",
                "0",
                "--unixsocket",
                str(self.sock),
                "--dir",
                str(self.dir),
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
            ],
            stdout=subprocess.DEVNULL,
        )
        wait_for(self.sock.exists, timeout=30)

    def crash(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.sock.unlink(missing_ok=True)


def test_redis_crash_mid_traffic_loses_no_acknowledged_write(
    start_server: ServerFactory, tmp_path: Path, user_id: str
) -> None:
    redis = _Redis(tmp_path)
    redis.start()
    try:
        server = start_server(redis_url=f"unix://{redis.sock}")
        acked: list[str] = []
        failed: list[tuple[str, str]] = []
        with memlane.Client(server.target, timeout=5) as c:
            sid = c.create_session(user_id=user_id).session.session_id
            stop = threading.Event()
            started: list[str] = []  # every call, appended as it begins

            def writer() -> None:
                i = 0
                while not stop.is_set():
                    mid = f"w{i:05d}"
                    started.append(mid)
                    try:
                        c.append_messages(
                            session_id=sid,
                            messages=[Message(message_id=mid, role=Role.ROLE_USER, content=f"n{i}")],
                        )
                        acked.append(mid)
                    except memlane.MemlaneError as exc:
                        failed.append((mid, type(exc).__name__))
                    i += 1

            t = threading.Thread(target=writer)
            t.start()
            try:
                wait_for(lambda: len(acked) >= 20, timeout=60)  # traffic flows before the crash
                redis.crash()
                # A call that begins after the crash runs while Redis is down: it rides on retries
                # (server- and client-side) or fails cleanly.
                at_crash = len(started)
                wait_for(lambda: len(started) >= at_crash + 2, timeout=60)
                redis.start()
                after_restart = len(acked)
                wait_for(lambda: len(acked) >= after_restart + 20, timeout=60)  # and traffic resumes
            finally:
                stop.set()
                t.join(60)
            assert not t.is_alive()
            stored = _ids(c, sid)
        print(f"acked={len(acked)} failed={len(failed)} stored={len(stored)}")
        assert set(acked) <= set(stored), "an acknowledged write was lost"
        assert len(stored) == len(set(stored)), "a retried write was duplicated"
        assert all(name == "UnavailableError" for _, name in failed), failed
        seqs_ok = c_seq_check(server.target, sid)
        assert seqs_ok
    finally:
        if redis.proc is not None:
            redis.proc.kill()
            redis.proc.wait()


def c_seq_check(target: str, sid: str) -> bool:
    with memlane.Client(target) as c:
        pages = memlane.iter_pages(
            lambda t: c.list_messages(session_id=sid, page_size=500, page_token=t), "messages"
        )
        seqs = [m.seq for m in pages]
    return seqs == list(range(1, len(seqs) + 1))


pytestmark = pytest.mark.slow


def test_reads_survive_a_redis_that_forgot_its_scripts(
    start_server: ServerFactory, tmp_path: Path, user_id: str
) -> None:
    """A restarted Redis (or SCRIPT FLUSH) answers NOSCRIPT: the range reads, bare and pipelined, load
    the script and resend. On a private embedded Redis (a flush would reach every test's server)."""
    srv = start_server(redis_url="", data_dir=str(tmp_path / "data"), key_prefix="ns")
    with memlane.Client(srv.target) as c:
        sid = c.create_session(user_id=user_id).session.session_id
        c.append_messages(
            session_id=sid, messages=[Message(role=Role.ROLE_USER, content=f"m{i}") for i in range(3)]
        )
        assert [m.content for m in c.list_messages(session_id=sid).messages] == ["m0", "m1", "m2"]
        for read in ("list", "tail"):
            redis = srv.sidecar.redis
            assert redis is not None

            async def flush(r: Any = redis) -> list[bool]:
                await r.script_flush()
                return list(await r.script_exists(srv.sidecar.sessions.messages._read.sha))

            assert asyncio.run_coroutine_threadsafe(flush(), srv._loop).result(10) == [False]
            if read == "list":  # the pipelined read (document fields + range)
                assert [m.content for m in c.list_messages(session_id=sid).messages] == ["m0", "m1", "m2"]
            else:  # the bare one, through assembly's history read (a sliding window reads the tail)
                blocks = [
                    b
                    for r in c.assemble_context(session_id=sid, strategy=cpb.CONTEXT_STRATEGY_SLIDING_WINDOW)
                    for b in r.blocks
                ]
                assert [m.content for m in blocks[-1].messages] == ["m0", "m1", "m2"]
