"""One owner for Redis: only the storage layer (the rooms in ``STORAGE``) knows keys, scripts and
encodings; everything else calls its named operations. This test reads the source (AST) of every server
module and fails on a Redis import, a Lua script, a registered script or a command sent through a Redis
client outside the modules allowed below."""

from __future__ import annotations

import ast
from pathlib import Path

import memlane_server

ROOT = Path(memlane_server.__file__).parent
# The storage layer: every module of these rooms may talk to Redis. One ``sessions`` package until issue
# 34 split it by what each store keeps (checkpoints and procedures beside it, long-term memory's Redis
# state beside ltm/, the key layout a leaf every store reaches).
STORAGE = ("sessions/", "checkpoints/", "procedures/store.py", "ltm/redis_state.py", "keyspace.py")

# Outside the storage layer, each allowed module with the reason it must touch Redis itself.
ALLOWED = {
    "infra/redis_pool.py": "builds the client (single node or cluster) every store shares, and wraps its"
    " command execution to time every round trip",
    "infra/redis_server.py": "starts (and probes) a Redis server when none is configured; server"
    " administration after an erasure (BGREWRITEAOF/BGSAVE): no keys",
    "infra/redis_lane.py": "a pipelined connection beside the pool for the hot path's single commands",
    "app.py": "composition root: creates the client, PINGs it at start and for health, closes it",
}

_CLIENT_NAMES = {"redis", "_redis"}


def _problems(source: str) -> list[str]:
    """What in ``source`` talks to Redis: imports, Lua, script registration, commands on a client."""
    out: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [
                f"line {node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] == "redis"
            ]
        elif (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").split(".")[0] == "redis"
            and not node.level
        ):
            out.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "redis.call(" in node.value or "redis.pcall(" in node.value:
                out.append(f"line {node.lineno}: a Lua script")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = node.func.value
            name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", "")
            if node.func.attr == "register_script":
                out.append(f"line {node.lineno}: register_script")
            elif name in _CLIENT_NAMES:
                out.append(f"line {node.lineno}: {name}.{node.func.attr}(...)")
    return out


def test_only_the_storage_layer_talks_to_redis() -> None:
    offenders: dict[str, list[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(STORAGE) or rel in ALLOWED:
            continue
        found = _problems(path.read_text())
        if found:
            offenders[rel] = found
    assert not offenders, f"Redis outside the storage layer (add a named operation in sessions/): {offenders}"


def test_every_allowed_module_exists() -> None:
    """A module moved or renamed leaves the list with it (no stale exemption for a future file)."""
    for rel in ALLOWED:
        assert (ROOT / rel).is_file(), f"{rel} is gone; drop it from ALLOWED"


def test_the_check_sees_each_kind_of_use() -> None:
    """Positive control: each pattern the first test forbids is found in a sample."""
    sample = """
import redis.asyncio as aioredis
from redis.exceptions import ResponseError
LUA = "return redis.call('GET', KEYS[1])"
class X:
    async def f(self):
        self._s = self._redis.register_script(LUA)
        await self._redis.hget("k", "f")
        await self.store.redis.zadd("k", {"m": 1})
"""
    found = " ".join(_problems(sample))
    for what in (
        "import redis.asyncio",
        "from redis.exceptions",
        "Lua",
        "register_script",
        "_redis.hget",
        "redis.zadd",
    ):
        assert what in found, (what, found)
    assert not _problems("from .sessions.store import SessionStore\nstore.get('s')\n")
