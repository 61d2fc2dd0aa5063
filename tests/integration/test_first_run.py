"""A user's first run on a new machine, as a terminal shows it: the README's `memlane serve` with nothing
configured (its embedded Redis, its worker, its model process) and no model prepared yet (an empty
model cache), the README's quick start in a process of its own, then Ctrl-C. A terminal's Ctrl-C sends
SIGINT to its whole foreground process group, children included, so the test sends it the same way
(``killpg``) to a serve started as a group leader.

What a user must not meet: a start that says nothing while it prepares the model (15-30 s), a library
warning on either terminal, an ERROR line, a worker or Redis restarted while the sidecar shuts down (a
child took the Ctrl-C itself, exited, and its supervisor took that for a crash), or a stop that does not
end.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import memlane
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]
START_S = 300  # the model's first load on a loaded 2-core machine; a ready sidecar ends the wait at once


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def quick_start(target: str) -> str:
    """The README's Python quick start, as a user pastes it, against ``target``."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start (Python client)", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    assert '"127.0.0.1:50051"' in code
    return str(code).replace('"127.0.0.1:50051"', repr(target))


def _serve(data: Path, port: int, log: Path, models: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMLANE_")}
    env["MEMLANE_DATA_DIR"] = str(data)
    env["MEMLANE_EMBEDDING_CACHE_DIR"] = str(models)  # nothing converted yet: a new machine
    cmd = [sys.executable, "-m", "memlane_server.cli", "serve", "--listen", f"127.0.0.1:{port}"]
    with log.open("wb") as out:
        # A group of its own, led by serve: what a shell gives a foreground job.
        return subprocess.Popen(
            [*cmd, "--admin-listen", f"127.0.0.1:{_port()}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def _answers(target: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"memlane serve exited: {log.read_text(errors='replace')[-2000:]}")
    try:
        with memlane.Client(target, timeout=2) as c:
            c.list_sessions(user_id="probe", page_size=1)
        return True
    except (memlane.UnavailableError, memlane.DeadlineExceededError):
        return False


def test_the_quick_start_prints_no_warning_and_ctrl_c_stops_serve_cleanly(tmp_path: Path) -> None:
    port, log = _port(), tmp_path / "serve.log"
    target = f"127.0.0.1:{port}"
    proc = _serve(tmp_path / "memlane-data", port, log, tmp_path / "models")
    try:
        wait_for(lambda: _answers(target, proc, log), timeout=START_S)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PYTHONWARNINGS": "default"}
        run = subprocess.run(
            [sys.executable, "-c", quick_start(target)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert "Prefers email over phone calls." in run.stdout  # the positive control: it did its work
        assert "Warning" not in run.stderr, run.stderr

        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = log.read_text(errors="replace")
    assert "memlane serving" in out, out[-2000:]  # it did start and serve
    # The model's preparation is said before it serves, and again once done.
    assert out.index("preparing the embedding model") < out.index("prepared the embedding model in")
    assert out.index("prepared the embedding model in") < out.index("memlane serving")
    assert "Warning" not in out, out[-3000:]
    assert not re.findall(r'"level":"(?:error|critical)"|\bERROR\b', out), out[-3000:]
    assert "starting it again" not in out, out[-3000:]
