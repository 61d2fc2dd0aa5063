"""What this installation was built from: the package version (pyproject.toml, the one place it is set)
and, when known, the git commit.

The image records the commit in ``build.json`` beside this module at build time (the Dockerfile's
VCS_REF); a source checkout of memlane (an editable install) asks git. A wheel built without either knows
only its version.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path

from memlane import __version__

_HERE = Path(__file__).resolve().parent
# A hex object name; a build from a tree with uncommitted changes adds "-dirty" (scripts/build-image).
_COMMIT = re.compile(r"[0-9a-f]{7,64}(-dirty)?")


def recorded_commit(path: Path) -> str:
    """The commit a build wrote into ``build.json``; "" when the file is absent, unreadable or holds none."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return ""
    value = data.get("commit") if isinstance(data, dict) else None
    return value if isinstance(value, str) and _COMMIT.fullmatch(value) else ""


def checkout_commit(package_dir: Path) -> str:
    """HEAD of the memlane checkout the package runs from; "" when it does not run from one.

    Only memlane's own checkout counts (pyproject.toml and .git at the root above server/): a venv that
    happens to live inside some other git repository must not report that repository's commit.
    """
    root = package_dir.parent.parent
    if not ((root / "pyproject.toml").is_file() and (root / ".git").exists()):
        return ""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    head = out.stdout.strip()
    return head if out.returncode == 0 and _COMMIT.fullmatch(head) else ""


@functools.cache
def commit() -> str:
    return recorded_commit(_HERE / "build.json") or checkout_commit(_HERE)


def version_line() -> str:
    """``memlane 0.1.0 (commit 0123456789ab)``, or without the commit when it is not known."""
    head = commit()
    if not head:
        return f"memlane {__version__}"
    name, dirty, _ = head.partition("-dirty")
    return f"memlane {__version__} (commit {name[:12]}{dirty})"
