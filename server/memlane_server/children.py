"""Child processes of ``memlane serve`` (its worker processes and its model process): how they start,
how their end is noticed, how often they are started again.

A child is started with ``subprocess.Popen`` (a vfork and exec) off the event loop: uvloop's own spawn
forks the whole process and runs every library's fork handlers, so gRPC and LanceDB warned at every
start (and a fork of a process running their threads can deadlock). Its settings go to its standard
input (no secret on a command line or on disk). Its exit is awaited on a pidfd: no thread, no SIGCHLD
handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import IO

log = logging.getLogger("memlane")

# Waits before each restart of a child that keeps dying, the last one repeated.
RESTART_BACKOFF_S = (1.0, 2.0, 5.0, 15.0, 30.0)


async def spawn(
    args: list[str], *, stdin: bytes, env: dict[str, str], niceness: int = 0
) -> subprocess.Popen[bytes]:
    """Starts ``args`` with ``stdin`` as its whole standard input, ``niceness`` added to this process's."""
    proc = await asyncio.to_thread(subprocess.Popen, args, stdin=subprocess.PIPE, env=env)
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


def backoff(failures: int) -> float:
    return RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)]


class Supervised:
    """One child kept running: ``spawn`` starts it, and starts it again (after ``backoff``) each time it
    exits, until ``stop_restarting``. ``what`` names it in the log (``"a worker process"``)."""

    def __init__(
        self, what: str, spawn: Callable[[], Awaitable[subprocess.Popen[bytes]]], **fields: object
    ) -> None:
        self._what, self._spawn, self._fields = what, spawn, fields
        self.proc: subprocess.Popen[bytes] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def start(self) -> None:
        self.proc = await self._spawn()
        self._task = asyncio.create_task(self._keep(), name=f"memlane-supervise-{self._what}")

    def stop_restarting(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()

    async def _keep(self) -> None:
        failures = 0
        while True:
            assert self.proc is not None
            rc = await exited(self.proc)
            if self._stopping:
                return
            delay = backoff(failures)
            failures += 1
            log.error(
                f"{self._what} exited; starting it again",
                extra={**self._fields, "returncode": rc, "restart_in_s": delay},
            )
            await asyncio.sleep(delay)
            if self._stopping:
                return
            self.proc = await self._spawn()


async def parent_gone(parent_pid: int, stop: asyncio.Event) -> None:
    """Sets ``stop`` once the process ``parent_pid`` is gone: a child outlives no serving process, even
    one killed with SIGKILL. Polled, as nothing signals it portably: a process is re-parented once its
    parent dies."""
    while True:
        await asyncio.sleep(_PARENT_CHECK_S)
        if os.getppid() != parent_pid:
            break
    log.warning("the serving process is gone; stopping")
    stop.set()


_PARENT_CHECK_S = 1.0


# glibc's M_ARENA_MAX: gRPC, ONNX Runtime and LanceDB run many threads, and glibc gives each thread
# its own malloc arena by default; their idle memory made the sidecar with LTM ~170 MB bigger.
_M_ARENA_MAX = -8


def limit_malloc_arenas(arenas: int = 2) -> None:
    """Like MALLOC_ARENA_MAX=2, for each process of memlane serve (serving, workers, the model process)
    before its threads start; an explicit variable wins."""
    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
        ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, arenas)


# How often a background process of memlane serve (a worker, the model process) hands memory it freed
# back to the system. glibc keeps freed heap for reuse: after a burst (a hostile 120 KB turn promoted, a
# flood of Embed calls) a process stayed 50-60 MB bigger for good. Not in the serving process: the trim
# holds the allocator's lock for a moment, which a request would wait for.
TRIM_INTERVAL_S = 30.0


async def return_freed_memory() -> None:
    """One ``malloc_trim(0)``, off the event loop (it walks the heap)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
            await asyncio.to_thread(ctypes.CDLL("libc.so.6").malloc_trim, 0)
