"""Start-up: a deferred package's submodules import without its ``__init__``; the package itself runs in
full on first use. Run in a fresh interpreter (the test session may have imported lancedb already)."""

from __future__ import annotations

import subprocess
import sys

_PROBE = """
import sys
from memlane_server.preflight import defer_unused_packages
defer_unused_packages()
import lancedb  # needs lance_namespace_urllib3_client.models only
print("api" in sys.modules["lance_namespace_urllib3_client"].__dict__)
from lance_namespace_urllib3_client import ApiClient  # first use of the package: it runs in full
print(ApiClient.__name__, "lance_namespace_urllib3_client.api" in sys.modules)
"""


def test_the_namespace_client_loads_only_when_used() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    assert out == ["False", "ApiClient", "True"]


_WORKER_PROBE = """
import sys
from memlane_server.preflight import defer_unused_packages
defer_unused_packages()
import memlane_server.cli.start  # what a worker process of memlane serve imports
print(type(sys.modules["onnxruntime"]).__name__)
import onnxruntime
print(onnxruntime.SessionOptions.__name__, type(sys.modules["onnxruntime"]).__name__)
"""


def test_onnxruntime_loads_only_where_a_model_runs() -> None:
    """A worker process embeds through the serving process's model: importing it leaves ONNX Runtime
    unloaded; the first use (the serving process's model load) runs it in full."""
    out = subprocess.run(
        [sys.executable, "-c", _WORKER_PROBE], capture_output=True, text=True, check=True, timeout=120
    ).stdout.split()
    assert out == ["_Deferred", "SessionOptions", "module"]
