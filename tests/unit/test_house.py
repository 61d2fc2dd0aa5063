"""The shape of the server package, held by a test so it does not drift back (issue 34): modules of an
even, readable size (the 90th percentile of their lines bounded: a count of modules would refuse a
concept its room, issue 42), no small room that exists only to serve one sibling (its lines belong in
that sibling, or beside its kin in a named room), and no circle between the package's rooms.

Run as a script to see the figures: ``python tests/unit/test_house.py``."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "server" / "memlane_server"
# Nine modules in ten at most this long (428 lines when the count cap was retired): past it a module
# usually holds more than one concept.
P90_LINES = 450
SMALL = 60


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([root.name, *parts])


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    if node.level:
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        target = ".".join([*base, node.module]) if node.module else ".".join(base)
    else:
        target = node.module or ""
    return [target] + [f"{target}.{alias.name}" for alias in node.names]


def import_graph(root: Path) -> tuple[dict[str, int], dict[str, set[str]]]:
    """Lines of each module, and who imports it (a module naming ``pkg.name`` imports ``pkg.name``
    when that is a module; otherwise ``pkg``)."""
    lines: dict[str, int] = {}
    sources: dict[str, tuple[ast.Module, bool]] = {}
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        text = path.read_text()
        lines[name] = len(text.splitlines())
        sources[name] = (ast.parse(text), path.name == "__init__.py")
    importers: dict[str, set[str]] = defaultdict(set)
    for name, (tree, is_package) in sources.items():
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                candidates = _resolve(name, is_package, node)
                named = [c for c in candidates[1:] if c in lines]
                targets = named or [candidates[0]]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if target in lines and target != name:
                    importers[target].add(name)
    return lines, importers


def _package(module: str, lines: dict[str, int]) -> str:
    return module if module + ".__init__" in lines else module.rsplit(".", 1)[0]


def small_one_sibling_rooms(root: Path) -> dict[str, str]:
    """Modules under SMALL lines imported by exactly one module, a sibling in the same package."""
    lines, importers = import_graph(root)
    packages = {module_name(p, root) for p in root.rglob("__init__.py")}
    found = {}
    for module, count in lines.items():
        if module in packages or count >= SMALL:
            continue
        users = importers.get(module, set())
        if len(users) != 1:
            continue
        (user,) = users
        home = module.rsplit(".", 1)[0]
        user_home = user if user in packages else user.rsplit(".", 1)[0]
        if user_home == home:
            found[module] = user
    return found


def _room(module: str, package: str) -> str | None:
    """The room of ``package`` that holds ``module``: its subpackage or its top-level module."""
    depth = package.count(".") + 1
    parts = module.split(".")
    if len(parts) <= depth or ".".join(parts[:depth]) != package:
        return None
    return ".".join(parts[: depth + 1])


def room_circles(root: Path) -> list[tuple[str, str]]:
    """Rooms of one package that reach themselves again through the imports between that package's
    rooms (subpackages or top-level modules), imports inside functions included."""
    _, importers = import_graph(root)
    packages = {module_name(p, root) for p in root.rglob("__init__.py")}
    circles: list[tuple[str, str]] = []
    for package in sorted(packages):
        edges: dict[str, set[str]] = defaultdict(set)
        for target, users in importers.items():
            for user in users:
                a, b = _room(user, package), _room(target, package)
                if a and b and a != b:
                    edges[a].add(b)
        for start in sorted(edges):
            seen: set[str] = set()
            stack = list(edges[start])
            while stack:
                room = stack.pop()
                if room == start:
                    circles.append((package, start))
                    break
                if room not in seen:
                    seen.add(room)
                    stack.extend(edges.get(room, ()))
    return circles


def test_no_circle_between_rooms() -> None:
    assert room_circles(PACKAGE) == []


def p90_lines(lines: dict[str, int]) -> int:
    sizes = sorted(lines.values())
    return sizes[int(0.9 * len(sizes))]


def test_nine_modules_in_ten_stay_short() -> None:
    lines, _ = import_graph(PACKAGE)
    assert p90_lines(lines) <= P90_LINES, sorted(lines.items(), key=lambda kv: -kv[1])[:20]


def test_no_small_room_serves_only_one_sibling() -> None:
    assert small_one_sibling_rooms(PACKAGE) == {}


def test_the_checks_see_a_small_room_and_a_circle(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "big.py").write_text("from .tiny import x\nfrom ..b import y\n" + "#\n" * 80)
    (pkg / "a" / "tiny.py").write_text("x = 1\n")
    (pkg / "b.py").write_text("from .a import big\ny = 2\n")
    assert small_one_sibling_rooms(pkg) == {"pkg.a.tiny": "pkg.a.big"}
    assert ("pkg", "pkg.a") in room_circles(pkg)
    assert p90_lines({f"m{i}": 100 * i for i in range(1, 11)}) == 1000  # the longest tenth is what counts


if __name__ == "__main__":
    lines, importers = import_graph(PACKAGE)
    print(f"{len(lines)} modules, p90 {p90_lines(lines)} lines (at most {P90_LINES})")
    for module, user in sorted(small_one_sibling_rooms(PACKAGE).items()):
        print(f"small, one sibling: {module} ({lines[module]} lines) <- {user}")
    for package, room in room_circles(PACKAGE):
        print(f"circle in {package} through {room}")
