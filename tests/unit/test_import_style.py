"""One import style inside the server package: relative imports of its own modules. Absolute
``memlane_server.`` imports were mixed in (191 of them) until the architecture pass."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "server" / "memlane_server"
_ABSOLUTE = re.compile(r"^[ \t]*(from memlane_server[.\s]|import memlane_server\b)", re.M)


def absolute_imports(root: Path) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        lines = [text.count("\n", 0, m.start()) + 1 for m in _ABSOLUTE.finditer(text)]
        if lines:
            found[str(path.relative_to(root))] = lines
    return found


def test_the_server_imports_its_own_modules_relatively() -> None:
    assert absolute_imports(PACKAGE) == {}


def test_the_check_sees_an_absolute_import(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("import os\n\nfrom memlane_server.ltm import model\n")
    (tmp_path / "ok.py").write_text("from .ltm import model\n")
    assert absolute_imports(tmp_path) == {"m.py": [3]}
