"""``min_score`` offered wherever memories are searched (issue 31): the SearchMemories RPC had it; the MCP
tool, the CLI and the high-level Python client now pass it on (the TypeScript client's is in
clients/typescript/test). A weak hit (the dog, for "keybindings") is left out at 0.5 while the strong
hit is kept (the positive control), and both are there without it."""

from __future__ import annotations

import json
import uuid

import pytest

import memlane
from memlane import Memlane, MemoryKind
from memlane_server.background import SidecarThread
from memlane_server.cli import main
from tests.integration.test_mcp import ok, stdio

QUERY = "keybindings"
STRONG = "Prefers vim keybindings in every editor."
WEAK = "User's dog is named Rex."


def _seed(target: str) -> str:
    user = f"ms-{uuid.uuid4().hex[:8]}"
    with Memlane(target) as m:
        for content in (STRONG, WEAK):
            m.remember(user, content, kind=MemoryKind.MEMORY_KIND_PREFERENCE)
    return user


@pytest.fixture(scope="module")
def seeded(server: SidecarThread) -> str:
    user = _seed(server.target)
    with Memlane(server.target) as m:
        scores = {h.memory.content: h.score for h in m.search(user, QUERY)}
    # The premise: both come back without a floor, the dog weakly (the issue saw 0.28), vim strongly.
    assert set(scores) == {STRONG, WEAK}, scores
    assert scores[WEAK] < 0.4 and scores[STRONG] > 0.5, scores
    return user


def test_python_clients(server: SidecarThread, seeded: str) -> None:
    with Memlane(server.target) as m:
        assert [h.memory.content for h in m.search(seeded, QUERY, min_score=0.5)] == [STRONG]


async def test_async_python_client(server: SidecarThread, seeded: str) -> None:
    async with memlane.AsyncMemlane(server.target) as m:
        assert [h.memory.content for h in await m.search(seeded, QUERY, min_score=0.5)] == [STRONG]
        assert len(await m.search(seeded, QUERY)) == 2


async def test_mcp_tool(server: SidecarThread, seeded: str) -> None:
    async with stdio(server.target, "--user", seeded, module="memlane_server.cli") as s:
        every = await ok(s, "search_memories", query=QUERY)
        assert {m["content"] for m in every["memories"]} == {STRONG, WEAK}
        strong = await ok(s, "search_memories", query=QUERY, min_score=0.5)
        assert [m["content"] for m in strong["memories"]] == [STRONG]


def test_cli(server: SidecarThread, seeded: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["memories", "list", "--user", seeded, "--query", QUERY, "--json", "--address", server.target]
    assert main(base) == 0
    assert {json.loads(line)["content"] for line in capsys.readouterr().out.splitlines()} == {STRONG, WEAK}
    assert main([*base, "--min-score", "0.5"]) == 0
    assert [json.loads(line)["content"] for line in capsys.readouterr().out.splitlines()] == [STRONG]
    assert main([*base, "--min-score", "5"]) == 0  # above every score: nothing, said on stderr
    out = capsys.readouterr()
    assert out.out == "" and "no memories" in out.err
