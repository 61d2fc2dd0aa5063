"""What the serving process of a default ``memlane serve`` weighs after light use, against what it
weighs idle: the README's quick start (six calls) must not make it grow for good.

It did by 54-91 MB PSS, ~50 MB of it anonymous (heap: the o200k_base encoding, ~46 MB, built on the
quick start's first context call for ``gpt-4o-mini``, while the 1-2 s build held that call). Now the
serving process builds the encodings of ``preload_encodings`` at start and gives back what their build
freed, so light use moves it by a few MB (measured ~3 anonymous, 4-35 PSS). The chart's memory request
is sized from the pod after this quick start (docs/operations.md, "Sizing"). One server start: the
machine's model cache, the defaults.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import memlane
from tests.conftest import wait_for
from tests.integration.test_first_run import quick_start

START_S = 120
SETTLE_S = 8.0  # after the worker started: its start-up (and the serving process's share of it) is over
GROWTH_MB = 25.0  # anonymous: main grew ~50 MB, this change ~3 MB


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rollup_mb(pid: int, field: str = "Pss") -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} in /proc/{pid}/smaps_rollup")


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False).stdout
    return [int(p) for p in out.split()]


def _pod(pid: int) -> dict[str, float]:
    """PSS in MB of the serving process (all of it, and its anonymous part) and of each of its children
    (worker, model process, Redis)."""
    figures = {"serving": _rollup_mb(pid), "serving anonymous": _rollup_mb(pid, "Pss_Anon")}
    for child in _children(pid):
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        figures[cmdline[:60]] = _rollup_mb(child)
    return {k: round(v, 1) for k, v in figures.items()}


def _serving(target: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"memlane serve exited: {log.read_text(errors='replace')[-2000:]}")
    try:
        with memlane.Client(target, timeout=2) as c:
            c.list_sessions(user_id="probe", page_size=1)
    except (memlane.UnavailableError, memlane.DeadlineExceededError):
        return False
    # The worker and the model process are up too (three children with Redis): idle means all of them.
    return len(_children(proc.pid)) >= 3


def test_the_quick_start_leaves_the_serving_process_about_as_big_as_it_started(tmp_path: Path) -> None:
    port, log = _port(), tmp_path / "serve.log"
    target = f"127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMLANE_")}
    env["MEMLANE_DATA_DIR"] = str(tmp_path / "data")
    cmd = [sys.executable, "-m", "memlane_server.cli", "serve", "--listen", target]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*cmd, "--admin-listen", f"127.0.0.1:{_port()}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        wait_for(lambda: _serving(target, proc, log), timeout=START_S)
        time.sleep(SETTLE_S)
        idle = _pod(proc.pid)
        run = subprocess.run(
            [sys.executable, "-c", quick_start(target)],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        # The positive control: the calls did their work (a search hit, a context with the turns).
        assert "Prefers email over phone calls." in run.stdout, run.stdout
        assert "arrived damaged" in run.stdout, run.stdout
        time.sleep(3.0)  # what the calls left running (the worker's jobs) settles
        after = _pod(proc.pid)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    # Its anonymous memory (heap, arenas: the process's own): a file page's share of PSS moves with
    # whatever else on the machine maps the same library (another sidecar, a test run), by 10-30 MB here.
    growth = after["serving anonymous"] - idle["serving anonymous"]
    assert growth < GROWTH_MB, (
        f"the serving process's anonymous memory grew {growth:.1f} MB: idle {idle}, after the quick"
        f" start {after}"
    )
