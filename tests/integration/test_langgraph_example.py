"""examples/langgraph_agent.py, run as a user would (separate processes) against a real sidecar."""

from __future__ import annotations

from memlane_server.background import SidecarThread
from tests.conftest import run_example


def test_langgraph_example_runs_resumes_and_recalls(server: SidecarThread) -> None:
    stdout = run_example("langgraph_agent.py", server.target)
    assert "resumed with 4 messages" in stdout
    assert "recalls:" in stdout and stdout.rstrip().endswith("ok")
