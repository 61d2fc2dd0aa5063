"""examples/openai_agents_session.py, run as a user would (separate processes) against a real sidecar."""

from __future__ import annotations

from memlane_server.background import SidecarThread
from tests.conftest import run_example


def test_openai_agents_example_runs_resumes_and_recalls(server: SidecarThread) -> None:
    stdout = run_example("openai_agents_session.py", server.target)
    assert "resumed with 6 items" in stdout  # 2 user turns, the call, its output, 2 replies
    assert "Lisbon" in stdout.split("instructions of the new session:")[1]
    assert stdout.rstrip().endswith("ok")
