"""examples/openai_agents_session.py, run as a user would (separate processes) against a real sidecar."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from memlane_server.background import SidecarThread

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openai_agents_session.py"


def test_openai_agents_example_runs_resumes_and_recalls(server: SidecarThread) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), server.target],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "resumed with 6 items" in out.stdout  # 2 user turns, the call, its output, 2 replies
    assert "Lisbon" in out.stdout.split("instructions of the new session:")[1]
    assert out.stdout.rstrip().endswith("ok")
