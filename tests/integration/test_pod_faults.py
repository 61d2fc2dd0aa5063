"""Faults of the pod's own parts, through real ``memlane serve`` processes with their embedded Redis:
the Redis belongs to its sidecar (dies with it, is stopped by the next start if it outlived it, is started
again if it dies alone), and health tells the truth about it (gRPC health, ``/healthz`` and ``memlane
health`` agree; liveness stays up while only Redis is down). docs/reliability.md, "Faults of the pod"."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import memlane
from memlane import Message, Role, new_id
from memlane.v1 import memory_pb2 as mpb
from memlane_server.bench.runner import children_of
from memlane_server.observability.health import LIVENESS_SERVICE
from tests.conftest import wait_for
from tests.integration.test_disk_full import _fill, small_disk  # noqa: F401 - a fixture

SERVING: int = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Pod:
    """``memlane serve`` on a Unix socket with its embedded Redis under ``data_dir``, the admin HTTP on a
    loopback port; ``nofile`` lowers its descriptor limit; ``tcp`` adds a loopback gRPC listener;
    ``umask`` starts it under that umask (as the image's entrypoint does)."""

    def __init__(
        self,
        tmp: Path,
        name: str,
        data_dir: Path,
        *,
        nofile: int = 0,
        tcp: bool = False,
        umask: str = "",
        **settings: Any,
    ) -> None:
        self.sock, self.log = tmp / f"{name}.sock", tmp / f"{name}.log"
        self.admin = free_port()
        self.tcp_port = free_port() if tcp else 0
        listen = f"unix:{self.sock}" + (f",127.0.0.1:{self.tcp_port}" if tcp else "")
        args = [sys.executable, "-m", "memlane_server.cli", "serve", "--listen", listen]
        args += ["--admin-listen", f"127.0.0.1:{self.admin}", "--redis-url", "", "--data-dir", str(data_dir)]
        args += ["--log-format", "text", "--worker-processes", "0"]
        settings.setdefault("ltm_enabled", "false")
        for key, value in settings.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEMLANE_")}

        if nofile:  # the shell's ulimit, then exec: the limit holds from the sidecar's first instruction
            args = ["sh", "-c", f'ulimit -n {int(nofile)} && exec "$@"', "sh", *args]
        if umask:
            args = ["sh", "-c", f'umask {int(umask, 8):04o} && exec "$@"', "sh", *args]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.target = f"unix:{self.sock}"
        try:
            wait_for(self._ready, timeout=120, describe=lambda: self.log.read_text()[-2000:])
        except BaseException:
            self.kill()
            raise

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"sidecar exited: {self.log.read_text()[-2000:]}")
        return self.grpc_health() == SERVING

    def grpc_health(self, service: str = "") -> int | None:
        """gRPC health of ``service``, asked as the chart's probes ask; None: no answer."""
        try:
            with grpc.insecure_channel(self.target) as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=service), timeout=10
                )
        except grpc.RpcError:
            return None
        return int(reply.status)

    def cli_health(self) -> int:
        """``memlane health``'s exit status (0: SERVING)."""
        cmd = [sys.executable, "-m", "memlane_server.cli", "health", "--target", self.target]
        return subprocess.run(cmd, capture_output=True, check=False, timeout=60).returncode

    def http(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}{path}", timeout=10) as reply:
                return int(reply.status), reply.read().decode()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read().decode()

    def metric(self, name: str) -> float:
        for line in self.http("/metrics")[1].splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def redis_pids(self) -> list[int]:
        return [p for p in children_of(self.proc.pid) if "redis-server" in _cmdline(p)]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _state(pid: int) -> str:
    """The process's state letter (R, S, T, Z, ...), "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for a parent that does not reap)."""
    return _state(pid) not in ("", "Z")


def redis_servers_in(data_dir: Path) -> list[int]:
    """Every live redis-server working in ``data_dir`` (its cwd is the data dir's redis/)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and "redis-server" in _cmdline(int(entry.name)):
            with contextlib.suppress(OSError):
                if Path(os.readlink(entry / "cwd")) == (data_dir / "redis").resolve() and alive(
                    int(entry.name)
                ):
                    out.append(int(entry.name))
    return out


@pytest.fixture()
def pods(tmp_path: Path) -> Iterator[list[Pod]]:
    running: list[Pod] = []
    yield running
    for p in running:
        p.stop()
    for pid in redis_servers_in(tmp_path / "data"):  # an orphan the change under test failed to stop
        for sig in (signal.SIGKILL, signal.SIGCONT):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def append(c: memlane.Client, sid: str, texts: list[str]) -> None:
    c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content=t) for t in texts])


def contents(c: memlane.Client, sid: str) -> list[str]:
    pages = memlane.iter_pages(
        lambda t: c.list_messages(session_id=sid, page_size=500, page_token=t), "messages"
    )
    return [m.content for m in pages]


def test_kill_9_of_the_sidecar_takes_its_embedded_redis_with_it(pods: list[Pod], tmp_path: Path) -> None:
    pod = Pod(tmp_path, "a", tmp_path / "data")
    pods.append(pod)
    (redis_pid,) = pod.redis_pids()
    assert alive(redis_pid)  # positive control: the Redis runs while its sidecar does
    pod.kill()  # SIGKILL: no shutdown code runs
    wait_for(lambda: not alive(redis_pid), timeout=30, describe=lambda: f"redis {redis_pid} still runs")
    assert redis_servers_in(tmp_path / "data") == []


def test_a_start_stops_the_redis_a_dead_sidecar_left_on_its_data_dir(pods: list[Pod], tmp_path: Path) -> None:
    data = tmp_path / "data"
    a = Pod(tmp_path, "a", data)
    pods.append(a)
    with memlane.Client(a.target, timeout=30) as c:
        sid = c.create_session(user_id="u-orphan").session.session_id
        append(c, sid, [f"kept {i}" for i in range(20)])
    (orphan,) = a.redis_pids()
    # A Redis that does not act on its parent's death at once (stopped, or stuck writing to a slow disk)
    # outlives its sidecar: it still holds appendonly.aof and the socket. The sidecar starts its Redis in
    # a process group of its own (a terminal's Ctrl-C must not reach it), and the kernel resumes a stopped
    # process whose group its parent's death orphans; a member whose parent lives (this test) keeps the
    # group from being orphaned, so the stopped Redis stays stopped, as a stuck one would.
    keeper = subprocess.Popen(["sleep", "300"], process_group=os.getpgid(orphan))
    try:
        os.kill(orphan, signal.SIGSTOP)
        wait_for(lambda: _state(orphan) == "T", timeout=30)  # stopped before its sidecar dies
        a.kill()
        assert alive(orphan)
        b = Pod(tmp_path, "b", data)
        pods.append(b)
    finally:
        keeper.kill()
        keeper.wait()
    assert not alive(orphan)  # stopped by b's start, before b started its own
    assert redis_servers_in(data) == b.redis_pids()  # one Redis on the files: b's
    assert "stopping the embedded redis (pid" in b.log.read_text()
    with memlane.Client(b.target, timeout=30) as c:
        assert contents(c, sid) == [f"kept {i}" for i in range(20)]
        append(c, sid, ["after"])  # b's Redis serves (its socket was not removed by the orphan's exit)
        assert contents(c, sid)[-1] == "after"


def test_a_second_sidecar_on_a_served_data_dir_is_refused(pods: list[Pod], tmp_path: Path) -> None:
    """Positive control of the stale-Redis path: a live owner is never stopped."""
    data = tmp_path / "data"
    a = Pod(tmp_path, "a", data)
    pods.append(a)
    cmd = [sys.executable, "-m", "memlane_server.cli", "serve", "--listen", f"unix:{tmp_path}/b.sock"]
    cmd += ["--admin-listen", "", "--redis-url", "", "--data-dir", str(data), "--ltm-enabled", "false"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 2
    assert f"already served by another memlane (pid {a.proc.pid})" in out.stderr
    assert a.grpc_health() == SERVING and len(a.redis_pids()) == 1


def test_a_killed_embedded_redis_is_started_again_on_its_aof(pods: list[Pod], tmp_path: Path) -> None:
    pod = Pod(tmp_path, "a", tmp_path / "data")
    pods.append(pod)
    assert pod.metric("memlane_embedded_redis_restarts_total") == 0
    with memlane.Client(pod.target, timeout=30) as c:
        sid = c.create_session(user_id="u-restart").session.session_id
        acknowledged = [f"m{i}" for i in range(50)]
        for i in range(0, 50, 10):
            append(c, sid, acknowledged[i : i + 10])
        (redis_pid,) = pod.redis_pids()
        os.kill(redis_pid, signal.SIGKILL)
        wait_for(lambda: pod.redis_pids() not in ([], [redis_pid]), timeout=60)

        def serves_again() -> bool:
            try:
                append(c, sid, ["after the restart"])
                return True
            except (memlane.UnavailableError, memlane.DeadlineExceededError):
                return False

        wait_for(serves_again, timeout=60, describe=lambda: pod.log.read_text()[-1500:])
        got = contents(c, sid)
        assert got[: len(acknowledged)] == acknowledged  # every acknowledged write kept
        assert got[-1] == "after the restart"
    assert pod.metric("memlane_embedded_redis_restarts_total") == 1
    text = pod.log.read_text()
    assert f"embedded redis (pid {redis_pid}) exited with -9; starting it again" in text
    wait_for(lambda: pod.grpc_health() == SERVING, timeout=30)


def test_health_says_not_serving_while_redis_takes_no_new_connection(pods: list[Pod], tmp_path: Path) -> None:
    pod = Pod(tmp_path, "a", tmp_path / "data")
    pods.append(pod)
    # Positive control: all three say SERVING while Redis serves.
    assert pod.grpc_health() == SERVING and pod.cli_health() == 0 and pod.http("/healthz")[0] == 200
    (redis_pid,) = pod.redis_pids()
    os.kill(redis_pid, signal.SIGSTOP)  # alive (no restart), but answers nothing
    try:
        wait_for(lambda: pod.grpc_health() == NOT_SERVING, timeout=60)
        assert pod.cli_health() == 1
        status, body = pod.http("/readyz")
        assert status == 503 and "redis does not answer a new connection" in body
        assert pod.http("/healthz")[0] == 503
        # Liveness is not readiness: the process answers, the pod must not be killed for Redis.
        assert pod.http("/livez")[0] == 200
        assert pod.grpc_health(LIVENESS_SERVICE) == SERVING
        assert pod.metric("memlane_health_serving") == 0
        # A call meanwhile: UNAVAILABLE once the pool's reconnects are spent, with a retry hint.
        with (
            memlane.Client(pod.target, timeout=300, retry=memlane.NO_RETRY) as c,
            pytest.raises(memlane.UnavailableError) as err,
        ):
            c.get_session(session_id="s-while-stopped")
        assert err.value.reason == "BACKEND_UNAVAILABLE" and err.value.retry_after == 1.0
    finally:
        os.kill(redis_pid, signal.SIGCONT)
    wait_for(lambda: pod.grpc_health() == SERVING, timeout=60)
    assert pod.cli_health() == 0 and pod.http("/healthz")[0] == 200
    assert "health: NOT_SERVING (redis: redis does not answer a new connection" in pod.log.read_text()


def test_a_removed_redis_socket_is_noticed_and_made_again(pods: list[Pod], tmp_path: Path) -> None:
    """What an orphaned Redis stopped with SIGTERM did on main: removed the live Redis's socket file.
    Pooled connections kept working, new ones failed, health stayed green."""
    data = tmp_path / "data"
    pod = Pod(tmp_path, "a", data)
    pods.append(pod)
    sock = data / "redis" / "redis.sock"
    with memlane.Client(pod.target, timeout=30) as c:
        sid = c.create_session(user_id="u-sock").session.session_id
        append(c, sid, ["before"])
        sock.unlink()
        wait_for(sock.exists, timeout=60, describe=lambda: pod.log.read_text()[-1500:])

        def new_connection_answers() -> bool:
            with socket.socket(socket.AF_UNIX) as s:
                try:
                    s.connect(str(sock))
                    s.sendall(b"PING\r\n")
                    return s.recv(16).startswith(b"+PONG")
                except OSError:
                    return False

        wait_for(new_connection_answers, timeout=60)
        wait_for(lambda: pod.grpc_health() == SERVING, timeout=60)
        append(c, sid, ["after"])
        assert contents(c, sid) == ["before", "after"]
    assert "socket" in pod.log.read_text() and "was removed while it ran" in pod.log.read_text()


def test_redis_out_of_disk_answers_resource_exhausted_and_health_says_so(
    pods: list[Pod],
    tmp_path: Path,
    small_disk: Path,  # noqa: F811 - the fixture imported from test_disk_full
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "redis").symlink_to(small_disk)  # the embedded Redis's directory on a small tmpfs
    pod = Pod(tmp_path, "a", data)
    pods.append(pod)
    acknowledged: list[str] = []
    with memlane.Client(pod.target, timeout=30, retry=memlane.NO_RETRY) as c:
        sid = c.create_session(user_id="u-disk").session.session_id

        pending: dict[str, Message] = {}  # a refused append, retried as the client retries: same id

        def stored(text: str) -> bool:
            message = pending.setdefault(
                text, Message(role=Role.ROLE_USER, content=text, message_id=new_id())
            )
            c.append_messages(session_id=sid, messages=[message])
            acknowledged.append(text)
            return True

        stored("before")  # positive control: writes are taken while there is room
        filler = _fill(small_disk)

        def refused() -> memlane.ResourceExhaustedError | None:
            try:
                # The first may still be taken (Redis buffers it); the one that meets the full disk may
                # be kept in Redis's memory though refused: its retry with the same id is no duplicate.
                stored(f"m{len(acknowledged)}")
            except memlane.ResourceExhaustedError as exc:
                return exc
            return None

        err = wait_for(refused, timeout=60, describe=lambda: pod.log.read_text()[-1500:])
        assert err.reason == "STORAGE_FULL" and err.retry_after and err.retry_after > 0
        assert "could not write to its disk" in str(err)
        wait_for(lambda: pod.grpc_health() == NOT_SERVING, timeout=60)
        status, body = pod.http("/readyz")
        assert status == 503 and "MISCONF" in body
        assert pod.cli_health() == 1
        filler.unlink()  # space returns: Redis writes its buffer out and takes writes again

        def taken() -> bool:
            try:
                return stored(f"m{len(acknowledged)}")
            except memlane.ResourceExhaustedError:
                return False

        wait_for(taken, timeout=60)
        wait_for(lambda: pod.grpc_health() == SERVING, timeout=60)
    pod.stop()  # nothing acknowledged is lost, even across a restart on that AOF
    again = Pod(tmp_path, "b", data)
    pods.append(again)
    with memlane.Client(again.target, timeout=30) as c:
        assert contents(c, sid) == acknowledged


@pytest.mark.parametrize("fsync", ["everysec", "always"])
def test_no_append_acknowledged_while_redis_cannot_write_its_aof_is_lost_on_a_restart_while_full(
    pods: list[Pod],
    tmp_path: Path,
    small_disk: Path,  # noqa: F811 - the fixture imported from test_disk_full
    fsync: str,
) -> None:
    """The disk stays full across the restart. Under ``everysec`` Redis answered the write whose AOF write
    failed (it keeps the command in its buffer and refuses only the next writes with MISCONF), so the
    last acknowledged append was gone after a restart that found the disk still full. Now an append is
    acknowledged only once Redis has taken its AOF write, else refused with STORAGE_FULL. Under
    ``always`` Redis exits rather than answer such a write (nothing acknowledged was lost on the base
    commit either), but every append was UNAVAILABLE while it was started again and again: now
    STORAGE_FULL too, and refused before it is tried. Positive controls: appends are taken before the
    disk fills and once space returns. Appends of 3 KB cross the tmpfs's pages, so one soon meets the
    full disk."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "redis").symlink_to(small_disk)
    pod = Pod(tmp_path, "a", data, embedded_redis_fsync=fsync)
    pods.append(pod)
    acknowledged: list[str] = []
    with memlane.Client(pod.target, timeout=30, retry=memlane.NO_RETRY) as c:
        sid = c.create_session(user_id="u-full").session.session_id
        for i in range(3):  # positive control: appends are taken while there is room
            append(c, sid, [f"before {i} " + "x" * 3000])
            acknowledged.append(f"before {i} " + "x" * 3000)
        filler = _fill(small_disk)
        refusals: list[memlane.MemlaneError] = []
        for i in range(40):
            text = f"full {i} " + "y" * 3000
            try:
                append(c, sid, [text])
            except (memlane.ResourceExhaustedError, memlane.UnavailableError) as exc:
                refusals.append(exc)
                if len(refusals) >= 3:
                    break
                continue
            acknowledged.append(text)
        assert refusals, "the full disk refused nothing"
        assert all(
            isinstance(e, memlane.ResourceExhaustedError) and e.reason == "STORAGE_FULL" for e in refusals
        ), refusals
    pod.stop()  # still full: the restarted Redis has only what reached its AOF
    again = Pod(tmp_path, "b", data, embedded_redis_fsync=fsync)
    pods.append(again)
    with memlane.Client(again.target, timeout=30, retry=memlane.NO_RETRY) as c:
        got = contents(c, sid)
        assert [t[:12] for t in got[: len(acknowledged)]] == [t[:12] for t in acknowledged]
        filler.unlink()
        after = Message(role=Role.ROLE_USER, content="after", message_id=new_id())

        def taken() -> bool:
            try:
                c.append_messages(session_id=sid, messages=[after])
            except memlane.ResourceExhaustedError:
                return False
            return True

        wait_for(taken, timeout=60)
        assert contents(c, sid)[-1] == "after"


def test_idle_connections_cannot_take_every_descriptor(pods: list[Pod], tmp_path: Path) -> None:
    """Connections that never speak, more than the descriptor limit allows: gRPC sheds those past the
    cap (sized from RLIMIT_NOFILE with room for Redis, LanceDB and archives) and closes the rest after the
    handshake timeout; meanwhile long-term memory (LanceDB, which opens files per write) keeps working."""
    nofile, flood = 1024, 1200
    pod = Pod(tmp_path, "a", tmp_path / "data", nofile=nofile, tcp=True, ltm_enabled="true")
    pods.append(pod)
    who = mpb.Caller(user_id="u-fds", agent_id="a1")
    with memlane.Client(pod.target, timeout=60, retry=memlane.NO_RETRY) as c:
        c.create_memory(caller=who, kind=mpb.MEMORY_KIND_FACT, content="User's locker is L-17.")  # control
        idle = [socket.create_connection(("127.0.0.1", pod.tcp_port)) for _ in range(flood)]
        try:
            open_ = set(idle)

            def closed_by_server(at_least: int) -> bool:
                for s in list(open_):
                    try:
                        if s.recv(4096, socket.MSG_DONTWAIT) == b"":
                            open_.discard(s)
                    except BlockingIOError:
                        pass
                    except OSError:
                        open_.discard(s)
                return flood - len(open_) >= at_least

            cap = int(pod.metric("memlane_grpc_connections_max")) // 2  # per listener (Unix + TCP)
            assert 0 < cap < flood

            def fds() -> int:
                return len(os.listdir(f"/proc/{pod.proc.pid}/fd"))

            # The server has taken the flood in: shed past the cap, or (without one) out of descriptors.
            wait_for(lambda: closed_by_server(flood - cap) or fds() >= nofile - 8, timeout=60)
            for i in range(5):  # LanceDB writes (a file each) and reads while the idle ones are held
                c.create_memory(caller=who, kind=mpb.MEMORY_KIND_FACT, content=f"User's badge {i} is B-{i}.")
            assert len(c.search_memories(caller=who, query="which badge?", limit=10).results) >= 5
            assert fds() < nofile - 200  # room left for Redis, LanceDB, archives
            assert closed_by_server(flood - cap)
            wait_for(lambda: pod.metric("memlane_grpc_connection_cap_reached_total") >= 1, timeout=60)
            assert "gRPC connections at the cap" in pod.log.read_text()
            wait_for(lambda: closed_by_server(flood), timeout=90)  # the handshake timeout closed the rest
        finally:
            for s in idle:
                s.close()
    with memlane.Client(f"127.0.0.1:{pod.tcp_port}", timeout=60) as fresh:  # a newcomer gets in again
        assert fresh.search_memories(caller=who, query="which locker?", limit=10).results


def test_a_table_damaged_while_serving_is_refused_for_reads_and_writes(
    pods: list[Pod], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    pod = Pod(tmp_path, "a", data, ltm_enabled="true")
    pods.append(pod)
    who = mpb.Caller(user_id="u-damaged", agent_id="a1")
    with memlane.Client(pod.target, timeout=60, retry=memlane.NO_RETRY) as c:
        for i in range(5):
            c.create_memory(caller=who, kind=mpb.MEMORY_KIND_FACT, content=f"User's locker {i} is L-{i}7.")
        # Positive control: every way in answers while the table is whole.
        assert len(c.search_memories(caller=who, query="which locker?", limit=10).results) == 5
        assert c.get_profile(caller=who).facts
        assert len(c.list_memories(caller=who).memories) == 5
        for f in (data / "ltm" / "memories.lance" / "data").glob("*.lance"):
            os.truncate(f, 64)
        calls: dict[str, Callable[[], object]] = {
            "search": lambda: c.search_memories(caller=who, query="which locker?", limit=10),
            "profile": lambda: c.get_profile(caller=who),
            "list": lambda: c.list_memories(caller=who),
            "create": lambda: c.create_memory(caller=who, kind=mpb.MEMORY_KIND_FACT, content="New fact."),
        }

        def met_damage() -> bool:  # LanceDB serves from its caches until a call reads the damaged bytes
            for call in calls.values():
                try:
                    call()
                except memlane.DataLossError:
                    return True
            return False

        wait_for(met_damage, timeout=60)
        for name, call in calls.items():
            with pytest.raises(memlane.DataLossError) as err:
                call()
            assert err.value.reason == "DATA_DAMAGED", name
            assert f"{data / 'ltm' / 'memories.lance'}" in str(err.value), name
            assert "restore that directory from a backup" in str(err.value), name
    wait_for(lambda: pod.grpc_health() == NOT_SERVING, timeout=60)
    status, body = pod.http("/readyz")
    assert status == 503 and "ltm: the long-term memory table is damaged" in body
    assert pod.log.read_text().count("store: the long-term memory table is damaged (") == 1  # one line
