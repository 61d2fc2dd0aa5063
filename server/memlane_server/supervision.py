"""A child process of ``memlane serve`` kept running and watched for progress, not only for its exit.

A child is started with ``subprocess.Popen`` (a vfork and exec) off the event loop: uvloop's own spawn
forks the whole process and runs every library's fork handlers, so gRPC and LanceDB warned at every
start (and a fork of a process running their threads can deadlock). Its settings go to its standard
input (no secret on a command line or on disk). Its exit is awaited on a pidfd: no thread, no SIGCHLD
handler.

A child that stops without dying (SIGSTOP, a wedged event loop, a process the kernel stopped) answers
nothing and exits never, so its exit alone says nothing. Each child therefore writes a byte down a pipe
from its event loop every fifth of ``stall_s`` (``heartbeat.py``; a second kind of byte once it serves),
and ``Supervised`` reads that pipe: a child silent for ``stall_s`` is killed with SIGKILL (SIGTERM does
not reach a stopped process; a worker's jobs and session leases are then taken over after the claim
timeout, as for any dead worker) and started again. A pipe costs one byte a second and no Redis round
trip, and it is closed by the kernel when the child dies, whatever killed it.

While a child is silent for half its bound, exited, or started again and not serving yet, ``reason``
says so (the pod's health names it), ``memlane_part_up{part}`` is 0, and each restart counts in
``memlane_part_restarts_total{part, cause}``. A child that keeps dying waits longer before each restart
(``RESTART_BACKOFF_S``); one that served for ``HEALTHY_RUN_S`` before it exited starts the count again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import IO

from prometheus_client import CollectorRegistry, Counter, Gauge

from .heartbeat import SERVING, beat_interval

log = logging.getLogger("memlane")

# Waits before each restart of a child that keeps dying, the last one repeated.
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 15.0, 30.0)
# A child that served this long before it exited was healthy: its next restart waits the first wait.
HEALTHY_RUN_S = 60.0
# A child's first beat may take this long: the interpreter starts and imports the CLI (a fraction of a
# second; seconds on a busy pod, at a worker's lower priority).
FIRST_BEAT_S = 10.0


def backoff(failures: int) -> float:
    return RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)]


async def spawn(
    args: list[str],
    *,
    stdin: bytes,
    env: dict[str, str],
    niceness: int = 0,
    pass_fds: tuple[int, ...] = (),
) -> subprocess.Popen[bytes]:
    """Starts ``args`` with ``stdin`` as its whole standard input, ``niceness`` added to this process's,
    and the descriptors ``pass_fds`` inherited (a heartbeat pipe's write end).

    In a process group of its own: a terminal's Ctrl-C goes to its whole foreground group, and a child
    that took it too would exit on its own while this process shuts down, its supervisor taking that for
    a crash (an ERROR line and a restart mid-shutdown). This process stops its children in order."""

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(args, stdin=subprocess.PIPE, env=env, pass_fds=pass_fds, process_group=0)

    proc = await asyncio.to_thread(start)
    if niceness:
        with contextlib.suppress(OSError):  # lowering a child's priority needs no privilege
            nice = min(19, os.getpriority(os.PRIO_PROCESS, 0) + niceness)
            os.setpriority(os.PRIO_PROCESS, proc.pid, nice)
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError):  # a child dead at once is noticed by whoever awaits it
        await asyncio.to_thread(_write_and_close, proc.stdin, stdin)
    return proc


def _write_and_close(pipe: IO[bytes], data: bytes) -> None:
    try:
        pipe.write(data)
    finally:
        pipe.close()


async def exited(proc: subprocess.Popen[bytes]) -> int:
    """The child's exit status, once it exits."""
    if proc.poll() is not None:
        return proc.returncode
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return proc.wait()
    gone: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        if not gone.done():
            gone.set_result(None)

    loop.add_reader(pidfd, readable)
    try:
        await gone
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    return proc.wait()


class PartMetrics:
    """The pod's children, watched: whether each answers, and how often each was started again."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.up = Gauge(
            "memlane_part_up",
            "1 while a part of the pod (the model process, a worker process) gives signs of life and serves;"
            " 0 while it is silent, exited or starting again.",
            ["part"],
            registry=registry,
        )
        self.restarts = Counter(
            "memlane_part_restarts_total",
            "Times a part of the pod was started again: it exited, or it was killed after giving no sign of"
            " life for child_stall_seconds (stalled).",
            ["part", "cause"],
            registry=registry,
        )


# Starts the child with the write end of its heartbeat pipe (a descriptor it inherits).
Spawn = Callable[[int], Awaitable[subprocess.Popen[bytes]]]


class Supervised:
    """One child kept running: ``spawn`` starts it, and starts it again (after ``backoff``) each time it
    exits or stays silent for ``stall_s``, until ``stop_restarting``. ``what`` names it in the log (``"a
    worker process"``, with ``fields``), ``name`` in health's reasons (``"worker process 0"``; default
    ``what``), ``part`` in the metrics (``"worker-0"``)."""

    def __init__(
        self,
        what: str,
        part: str,
        spawn: Spawn,
        *,
        stall_s: float,
        metrics: PartMetrics,
        healthy_s: float = HEALTHY_RUN_S,
        name: str = "",
        **fields: object,
    ) -> None:
        self._what, self._part, self._spawn, self._fields = what, part, spawn, fields
        self._name = name or what  # in health's reasons, where the log's fields are not shown
        self._stall_s, self._healthy_s = stall_s, healthy_s
        self._up, self._restarts = metrics.up.labels(part), metrics.restarts
        self.proc: subprocess.Popen[bytes] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._beats = -1  # this child's heartbeat pipe (read end), -1 before the first start
        self._beat_at = 0.0  # monotonic: the last byte read from it (or the start)
        self._beaten = False  # whether this child has beaten at all
        self._serving_since = 0.0  # monotonic: when it said it serves; 0 not yet
        self._down = ""  # why it is not serving since it last stopped ("" while it serves or first starts)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def reason(self) -> str | None:
        """Why this part does not serve now, or None: a health check's answer."""
        if self._stopping:
            return None
        self._read_beats()
        silent = time.monotonic() - self._beat_at
        if self.alive and self._serving_since and silent > self._stall_s / 2:
            return (
                f"{self._name} has given no sign of life for {silent:.1f} s (killed at {self._stall_s:g} s)"
            )
        return self._down or None

    async def start(self) -> None:
        await self._start_child()
        self._task = asyncio.create_task(self._keep(), name=f"memlane-supervise-{self._part}")

    def stop_restarting(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
        self._close_beats()

    async def _start_child(self) -> None:
        self._close_beats()
        read, write = os.pipe()
        os.set_blocking(read, False)
        try:
            self.proc = await self._spawn(write)
        finally:
            os.close(write)  # the child holds its own copy; EOF here once it is gone
        self._beats, self._beat_at, self._serving_since = read, time.monotonic(), 0.0
        self._beaten = False

    def _close_beats(self) -> None:
        if self._beats >= 0:
            os.close(self._beats)
            self._beats = -1

    def _read_beats(self) -> None:
        """Takes what the child wrote since the last read (the pipe holds every beat meanwhile, so a busy
        event loop here never mistakes a live child for a silent one)."""
        if self._beats < 0:
            return
        try:
            got = os.read(self._beats, 4096)
        except BlockingIOError:
            return
        if not got:
            return  # the child is gone: its exit is awaited elsewhere
        self._beat_at, self._beaten = time.monotonic(), True
        if SERVING in got and not self._serving_since:
            self._serving_since = self._beat_at
            self._up.set(1)  # at once, as health reads it (health reads the beats too, between ticks)
            if self._down:
                log.warning(f"{self._what} serves again", extra=self._fields)
            self._down = ""

    async def _keep(self) -> None:
        failures = 0
        while True:
            assert self.proc is not None
            cause, rc = await self._watch(self.proc)
            if self._stopping:
                return
            if self._serving_since and time.monotonic() - self._serving_since >= self._healthy_s:
                failures = 0  # it served a healthy run: this is not a crash loop
            delay = backoff(failures)
            failures += 1
            self._restarts.labels(self._part, cause).inc()
            self._up.set(0)
            if cause == "stalled":
                self._down = (
                    f"{self._name} gave no sign of life for {self._stall_s:g} s; killed, starting it again"
                )
            else:
                self._down = f"{self._name} exited (status {rc}); starting it again"
            self._serving_since = 0.0
            log.error(
                f"{self._what} {'stalled' if cause == 'stalled' else 'exited'}; starting it again",
                extra={**self._fields, "returncode": rc, "restart_in_s": delay},
            )
            await asyncio.sleep(delay)
            if self._stopping:
                return
            await self._start_child()

    async def _watch(self, proc: subprocess.Popen[bytes]) -> tuple[str, int]:
        """Until ``proc`` exits (``"exited"``) or is killed for silence (``"stalled"``): its status."""
        gone = asyncio.ensure_future(exited(proc))
        try:
            while not gone.done():
                await asyncio.wait([gone], timeout=beat_interval(self._stall_s))
                self._read_beats()
                silent = time.monotonic() - self._beat_at
                self._up.set(1 if self._serving_since and silent <= self._stall_s / 2 else 0)
                bound = self._stall_s if self._beaten else max(self._stall_s, FIRST_BEAT_S)
                if not gone.done() and silent > bound and not self._stopping:
                    log.error(
                        f"{self._what} gave no sign of life for {silent:.1f} s (stopped?); killing it",
                        extra={**self._fields, "pid": proc.pid},
                    )
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()  # SIGKILL: SIGTERM stays pending on a stopped process
                    return "stalled", await gone
            return "exited", gone.result()
        finally:
            gone.cancel()
