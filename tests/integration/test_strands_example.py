"""examples/strands_session.py, run as a user would (separate processes) against a real sidecar."""

from __future__ import annotations

from memlane_server.background import SidecarThread
from tests.conftest import run_example


def test_strands_example_runs_resumes_and_remembers(server: SidecarThread) -> None:
    stdout = run_example("strands_session.py", server.target)
    assert "resumed with 6 messages; state: {'home': 'Lisbon'}" in stdout
    assert "search_memory found: True" in stdout
    assert stdout.rstrip().endswith("ok")
