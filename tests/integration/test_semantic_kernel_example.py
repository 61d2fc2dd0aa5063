"""examples/semantic_kernel_thread.py, run as a user would (separate processes) against a real sidecar."""

from __future__ import annotations

from memlane_server.background import SidecarThread
from tests.conftest import run_example


def test_semantic_kernel_example_runs_and_resumes(server: SidecarThread) -> None:
    stdout = run_example("semantic_kernel_thread.py", server.target)
    # 2 user turns, 2 replies, the function call and its result, in the order they happened
    assert (
        "resumed with 6 messages: ['user', 'assistant', 'user', 'assistant', 'tool', 'assistant']" in stdout
    )
    assert "the model was sent 8 messages" in stdout
    assert stdout.rstrip().endswith("ok")
