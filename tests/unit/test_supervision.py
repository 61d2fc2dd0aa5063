"""A supervised child (supervision.py) with real child processes, each a few lines of Python writing its
heartbeat pipe: one that stops itself (SIGSTOP) is killed after the stall bound and started again, one
that is slow but beats is left alone (the control), and the restart backoff starts again after a healthy
run while it grows for a child that keeps dying at once."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys

import pytest
from prometheus_client import CollectorRegistry

from memlane_server.supervision import PartMetrics, Supervised, spawn

# A child: says it serves, then runs ``body`` (its heartbeat pipe's descriptor is ``fd``).
CHILD = "import os, signal, sys, time; fd = int(sys.argv[1]); os.write(fd, b'.!'); {body}"


def _supervised(
    body: str, *, stall_s: float, healthy_s: float = 60.0
) -> tuple[Supervised, CollectorRegistry]:
    registry = CollectorRegistry()

    async def start(fd: int) -> subprocess.Popen[bytes]:
        args = [sys.executable, "-c", CHILD.format(body=body), str(fd)]
        return await spawn(args, stdin=b"", env=dict(os.environ), pass_fds=(fd,))

    child = Supervised(
        "the test child", "test", start, stall_s=stall_s, metrics=PartMetrics(registry), healthy_s=healthy_s
    )
    return child, registry


def _restarts(registry: CollectorRegistry, cause: str) -> float:
    return registry.get_sample_value("memlane_part_restarts_total", {"part": "test", "cause": cause}) or 0.0


def test_a_child_that_stops_itself_is_killed_and_started_again() -> None:
    async def run() -> tuple[float, float, int, int | None, str | None]:
        stopped, stopped_metrics = _supervised("os.kill(os.getpid(), signal.SIGSTOP)", stall_s=0.5)
        # The control: busy for 2 s (four times the bound) but beating from its loop every 0.1 s.
        slow, slow_metrics = _supervised(
            "[(time.sleep(0.1), os.write(fd, b'.')) for _ in range(20)]; time.sleep(30)", stall_s=0.5
        )
        await stopped.start()
        await slow.start()
        first, slow_pid = stopped.proc, slow.proc
        assert first is not None and slow_pid is not None
        await asyncio.sleep(2.5)
        reason = stopped.reason()
        try:
            return (
                _restarts(stopped_metrics, "stalled"),
                _restarts(slow_metrics, "stalled") + _restarts(slow_metrics, "exited"),
                first.returncode if first.poll() is not None else 0,
                slow.proc.pid if slow.proc is not None and slow.alive else None,
                reason,
            )
        finally:
            for child in (stopped, slow):
                child.stop_restarting()
                if child.proc is not None and child.proc.poll() is None:
                    child.proc.kill()
                    child.proc.wait()

    stalled, slow_restarts, first_status, slow_alive, reason = asyncio.run(run())
    assert stalled >= 1
    assert first_status == -9  # SIGKILL: SIGTERM stays pending on a stopped process
    assert reason is not None and "the test child" in reason
    assert slow_restarts == 0 and slow_alive is not None


@pytest.mark.parametrize(("healthy_s", "expected"), [(60.0, [1.0, 2.0]), (0.1, [1.0, 1.0])])
def test_backoff_starts_again_after_a_healthy_run(
    caplog: pytest.LogCaptureFixture, healthy_s: float, expected: list[float]
) -> None:
    """A child that serves 1.5 s then exits: with a healthy run of 0.1 s each exit follows one (the wait
    stays at 1 s); with 60 s (the control) it is a crash loop and the wait grows. (Beats are read every
    second: a run is known healthy to within that.)"""

    async def run() -> None:
        child, _ = _supervised("time.sleep(1.5)", stall_s=5.0, healthy_s=healthy_s)
        await child.start()
        await asyncio.sleep(4.5)
        child.stop_restarting()
        if child.proc is not None and child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait()

    with caplog.at_level(logging.ERROR, logger="memlane"):
        asyncio.run(run())
    waits = [r.restart_in_s for r in caplog.records if hasattr(r, "restart_in_s")]
    assert waits[:2] == expected, waits
