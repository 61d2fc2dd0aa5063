"""LanceDB predicates never hold a caller string: every string a predicate tests is compared through
its digest column, against the real engine, for a corpus of hostile values. Also the migration of a
table written before the digest columns existed."""

from __future__ import annotations

from pathlib import Path

import lancedb
import pyarrow as pa
import pytest
from lancedb.expr import col, lit
from lancedb.index import Bitmap, BTree

from memlane_server.ltm import LanceMemoryStore, MemoryItem, MemoryKind, MemoryScope, Visibility, filters
from memlane_server.ltm.schema import TABLE_NAME, table_schema, to_row
from memlane_server.ltm.store import checked
from tests.hostile import HOSTILE

NDIMS = 384


def item(n: int, user_id: str, *, agent: str = "a", group: str = "", channel: str = "") -> MemoryItem:
    return MemoryItem(
        id=f"mem-{n}",
        user_id=user_id,
        agent_id=agent,
        scope=MemoryScope.GROUP if group else MemoryScope.USER,
        kind=MemoryKind.FACT,
        content=f"content {n}",
        group=group,
        channel=channel,
        created_at_ms=1000 + n,
        vector=[1.0 / (n + 1)] * NDIMS,
    )


def test_checked_refuses_caller_strings_in_a_predicate() -> None:
    assert checked(filters.owned_by("a\\')) OR true --"))  # digests pass
    with pytest.raises(ValueError, match="not a digest"):
        checked(col("user_id") == lit("a\\')) OR true --"))
    with pytest.raises(ValueError, match="not a digest"):
        checked(col("user_id") == lit("alice"))


async def test_hostile_values_match_only_their_own_rows(tmp_path: Path) -> None:
    store = await LanceMemoryStore.open(str(tmp_path / "ltm"), NDIMS)
    values = [v for v in HOSTILE if v] + ["bystander"]
    await store.add([item(i, v, agent=v, group=v, channel=v) for i, v in enumerate(values)])
    total = await store.count()
    assert total == len(values)
    for i, v in enumerate(values):
        # Positive control: the hostile value finds its own row on every digest column...
        who = Visibility(v, "other-agent", [v])
        assert [x.id for x in await store.fetch(filters.visible_to(who))] == [f"mem-{i}"]
        assert [x.id for x in await store.fetch(filters.written_by(v, v))] == [f"mem-{i}"]
        assert await store.count(filters.is_("channel", v)) == 1
        # ...and an update or a delete through it touches that row only.
        await store.update(filters.owned_by(v) & filters.with_id(f"mem-{i}"), {"wrong_count": "7"})
        counts = (await store.fetch_columns(None, ["id", "wrong_count"])).to_pylist()
        assert {r["id"] for r in counts if r["wrong_count"] == 7} == {f"mem-{j}" for j in range(i + 1)}
    for i, v in enumerate(values[:-1]):
        await store.delete(filters.owned_by(v))
        assert await store.count() == total - i - 1
    assert [x.user_id for x in await store.fetch(filters.owned_by("bystander"))] == ["bystander"]
    store.close()


async def test_a_table_without_digest_columns_is_migrated(tmp_path: Path) -> None:
    """Data dirs of memlane 0.1 hold no key columns: opening computes them (SQL sha256 == filters.key)."""
    uri = str(tmp_path / "ltm")
    keys = set(filters.KEY_COLUMNS.values())
    old_schema = pa.schema([f for f in table_schema(NDIMS) if f.name not in keys])
    rows = [
        {k: v for k, v in to_row(item(i, u, agent=u)).items() if k not in keys}
        for i, u in enumerate(["José", "a\\')) OR true --", "bob+tag@example.com"])
    ]
    rows[0]["agent_id"] = None  # an old row may hold nulls: its digest is that of ""
    db = await lancedb.connect_async(uri)
    table = await db.create_table(TABLE_NAME, data=pa.Table.from_pylist(rows, schema=old_schema))
    await table.create_index("user_id", config=Bitmap())  # as 0.1 indexed it
    await table.create_index("id", config=BTree())
    # lancedb leaves close() unannotated (as in ltm/store.py): no typed call exists.
    table.close()  # type: ignore[no-untyped-call]
    db.close()  # type: ignore[no-untyped-call]

    store = await LanceMemoryStore.open(uri, NDIMS)
    assert keys <= set((await store.fetch_columns(None, ["id", *keys])).column_names)
    indexed = {tuple(ix.columns) for ix in await store._table.list_indices()}
    assert ("user_key",) in indexed and ("user_id",) not in indexed and ("id",) not in indexed
    for i, u in enumerate(["José", "a\\')) OR true --", "bob+tag@example.com"]):
        assert [x.id for x in await store.fetch(filters.owned_by(u))] == [f"mem-{i}"]
    assert [x.id for x in await store.fetch(filters.written_by("José", ""))] == ["mem-0"]
    store.close()
    reopened = await LanceMemoryStore.open(uri, NDIMS)  # a second open migrates nothing
    assert await reopened.count() == 3
    reopened.close()
