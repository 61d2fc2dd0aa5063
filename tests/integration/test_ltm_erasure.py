"""Erasing rows from the LanceDB table leaves none of their bytes on disk: not in the data file of a
fragment that still holds other users' rows (a plain delete only marks them), not in the full-text
index, not in old versions or transaction files. Real LanceDB in a tmp dir."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from memlane_server.ltm import LanceMemoryStore, MemoryItem, MemoryKind, MemoryScope, filters

MARK = "Zebramarkerqq"


def item(n: int, user: str, content: str) -> MemoryItem:
    return MemoryItem(
        id=f"mem-{n}",
        user_id=user,
        agent_id="a",
        scope=MemoryScope.USER,
        kind=MemoryKind.FACT,
        content=content,
        vector=[0.01] * 384,
    )


def holders(root: Path, needle: bytes) -> list[str]:
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


async def test_erase_rewrites_the_fragment_the_rows_shared_with_others(tmp_path: Path) -> None:
    root = tmp_path / "ltm"
    store = await LanceMemoryStore.open(str(root), 384)
    await store.add([item(i, f"user{i % 7}", f"other user fact number {i} about gardens") for i in range(60)])
    await store.add([item(60, "victim", f"Victim secret {MARK} lives here")])
    await store.add([item(61 + i, "user1", f"later fact {i}") for i in range(60)])
    await store.optimize(cleanup_older_than=timedelta(0))  # one fragment, indexed: the hard case
    # Positive controls: the content and the id sit in a data file shared with other users' rows.
    # (The full-text index holds its terms too, but encoded: a raw scan cannot see them there.)
    assert any(h.startswith("memories.lance/data/") for h in holders(root, MARK.encode()))
    assert any(h.startswith("memories.lance/data/") for h in holders(root, b"victim"))

    assert await store.erase(filters.owned_by("victim")) == 1

    for needle in (MARK.encode(), b"victim", filters.key("victim").encode()):
        assert holders(root, needle) == [], needle
    assert await store.count() == 120
    assert len(await store.fetch(filters.owned_by("user1"))) == 60 + 60 // 7 + 1
    hits = await store.keyword_search("gardens", filters.owned_by("user3"), 50)
    assert hits  # the rebuilt full-text index still serves the others
    store.close()
