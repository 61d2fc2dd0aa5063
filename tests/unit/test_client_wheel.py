"""What the README's client install gives (``pip install /path/to/memlane``, or the wheel a release
builds, docs/releasing.md): one wheel whose unconditional requirements are the client's three (the
sidecar's sit behind the ``server`` extra), whose ``memlane`` imports, with nothing of the source tree
on the path, and has the high-level lifecycle (issue 47)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLIENT_REQUIRES = ["googleapis-common-protos", "grpcio", "protobuf"]


def _name(requirement: str) -> str:
    """The distribution a Requires-Dist line names (``grpcio>=1.60`` -> ``grpcio``)."""
    found = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert found, requirement
    return found.group(0).lower()


def test_the_wheel_is_the_client_alone(tmp_path: Path) -> None:
    # Built from a copy, so the build's own files (build/, *.egg-info) never land in the tree; with the
    # environment's setuptools, so nothing is fetched.
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "build.json")
    for part in ("client_py", "server"):
        shutil.copytree(ROOT / part, src / part, ignore=skip)
    for part in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / part, src / part)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            "dist",
            ".",
        ],
        cwd=src,
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    (wheel,) = (src / "dist").glob("*.whl")
    assert wheel.name == f"memlane-{version}-py3-none-any.whl"

    with zipfile.ZipFile(wheel) as archive:
        meta = archive.read(f"memlane-{version}.dist-info/METADATA").decode()
    requires = [
        line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")
    ]
    assert sorted(_name(r) for r in requires if "extra ==" not in r) == CLIENT_REQUIRES
    server = {_name(r) for r in requires if 'extra == "server"' in r}
    assert {"lancedb", "redis", "onnxruntime", "pyyaml"} <= server  # control: the sidecar's are there

    site = tmp_path / "site"
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    code = (
        "import sys, memlane\n"
        "assert memlane.__file__.startswith(sys.argv[1]), memlane.__file__\n"
        "print(memlane.__version__, *sorted(n for n in vars(memlane.Memlane) if not n.startswith('_')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-c", code, str(site)], capture_output=True, text=True, check=False, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == version
    assert {"get", "get_all", "update", "delete", "history", "close_session"} <= set(out.stdout.split())
