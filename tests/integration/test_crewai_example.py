"""examples/crewai_memory.py, run as a user would (separate processes) against a real sidecar."""

from __future__ import annotations

from memlane_server.background import SidecarThread
from tests.conftest import run_example


def test_crewai_example_stores_recalls_and_resets(server: SidecarThread) -> None:
    stdout = run_example("crewai_memory.py", server.target)
    assert "stored 3 records; scopes: ['/company', '/people']" in stdout
    assert "recalled: The database is PostgreSQL 16." in stdout
    assert "after reset: 0 crew records; the user's other memories: ['Dana lives in Lisbon.']" in stdout
    assert stdout.rstrip().endswith("ok")
