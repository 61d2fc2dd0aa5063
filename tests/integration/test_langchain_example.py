"""examples/langchain_history.py, run as a user would (separate processes) against a real sidecar."""

from __future__ import annotations

from memlane_server.background import SidecarThread
from tests.conftest import run_example


def test_langchain_example_runs_resumes_and_recalls(server: SidecarThread) -> None:
    stdout = run_example("langchain_history.py", server.target)
    assert "resumed with 6 messages" in stdout  # 2 user turns, the call, its output, 2 replies
    assert any("recalls:" in line and "Lisbon" in line for line in stdout.splitlines())
    assert stdout.rstrip().endswith("ok")
