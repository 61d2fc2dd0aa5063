"""A child's side of its heartbeat pipe (the parent's: ``supervision.py``): signs of life for the
``memlane serve`` that started it. Light on purpose (no server import): a worker makes it before its
imports and start, which take seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading

BEAT, SERVING = b".", b"!"  # what a child writes down its heartbeat pipe
_MAX_BEAT_S = 1.0  # a child beats at least this often, whatever its bound


def beat_interval(stall_s: float) -> float:
    """How often a child with the bound ``stall_s`` beats: five beats missed before it is killed."""
    return min(_MAX_BEAT_S, stall_s / 5)


class Heartbeat:
    """A child's end of its heartbeat pipe: a byte every ``beat_interval`` while it runs, and ``serving``
    once it serves. Made first thing in the child (before its imports and its start, seconds on a busy
    pod): a thread beats until ``start``, then the event loop does, so a wedged loop falls silent. Never
    blocks: a full pipe (a parent not reading) or a gone parent loses a beat, nothing more."""

    def __init__(self, fd: int, stall_s: float) -> None:
        self._fd = fd
        self._interval = beat_interval(stall_s)
        self._task: asyncio.Task[None] | None = None
        self._loop_beats = threading.Event()
        if fd >= 0:
            os.set_blocking(fd, False)
            self._write(BEAT)
            threading.Thread(target=self._beat_until_the_loop, name="memlane-heartbeat", daemon=True).start()

    def start(self) -> None:
        """From now on the running event loop beats (a stopped or wedged loop is a stalled child)."""
        self._loop_beats.set()
        if self._fd >= 0 and self._task is None:
            self._task = asyncio.create_task(self._beat(), name="memlane-heartbeat")

    def serving(self) -> None:
        self._write(SERVING)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _beat_until_the_loop(self) -> None:
        while not self._loop_beats.wait(self._interval):
            self._write(BEAT)

    async def _beat(self) -> None:
        while True:
            self._write(BEAT)
            await asyncio.sleep(self._interval)

    def _write(self, byte: bytes) -> None:
        if self._fd >= 0:
            with contextlib.suppress(BlockingIOError, BrokenPipeError):
                os.write(self._fd, byte)
