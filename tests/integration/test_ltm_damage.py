"""A damaged LanceDB table found at start (a data file cut short, or overwritten): the sidecar answers
DATA_LOSS naming the table and what to do, never wrong or partial results, and never UNAVAILABLE (which
invites a retry that meets the same damage)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

import memlane
from memlane.v1 import memory_pb2 as mpb
from tests.conftest import ServerFactory


def _remember(c: memlane.Client, who: mpb.Caller) -> None:
    for i in range(5):
        c.create_memory(caller=who, kind=mpb.MEMORY_KIND_FACT, content=f"User's locker {i} is L-{i}7.")


@pytest.mark.parametrize("damage", ["truncated", "overwritten"])
def test_a_damaged_table_is_reported_as_data_loss(
    start_server: ServerFactory, tmp_path: Path, damage: str
) -> None:
    data, prefix = tmp_path / "data", f"dmg{uuid.uuid4().hex[:8]}"
    who = mpb.Caller(user_id="u-damage", agent_id="a1")
    first = start_server(data_dir=str(data), key_prefix=prefix)
    with memlane.Client(first.target, timeout=30) as c:
        _remember(c, who)
        # Positive control: the table serves before it is damaged.
        assert len(c.search_memories(caller=who, query="which locker?", limit=10).results) == 5
    first.stop()
    files = sorted((data / "ltm" / "memories.lance" / "data").glob("*.lance"))
    assert files
    victim = files[0]
    if damage == "truncated":
        os.truncate(victim, 64)
    else:
        victim.write_bytes(os.urandom(victim.stat().st_size))
    second = start_server(data_dir=str(data), key_prefix=prefix)
    with memlane.Client(second.target, timeout=30, retry=memlane.NO_RETRY) as c:
        for call in (
            lambda: c.search_memories(caller=who, query="which locker?", limit=10),
            lambda: c.list_memories(caller=who),
        ):
            with pytest.raises(memlane.DataLossError) as err:
                call()
            assert err.value.reason == "DATA_DAMAGED"
            assert "long-term memory table is damaged" in str(err.value)
