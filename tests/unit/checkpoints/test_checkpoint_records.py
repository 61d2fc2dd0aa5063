"""A checkpoint's record (checkpoints/store.py): what export writes and the archive keeps must read back
as the same checkpoint, and names that would break the key layout are refused before Redis."""

from __future__ import annotations

import pytest

from memlane_server.checkpoints.store import Checkpoint, Typed, Write, check_name, from_record, to_record
from memlane_server.errors import InvalidArgument


def _checkpoint() -> Checkpoint:
    return Checkpoint(
        session_id="s1",
        namespace="ns",
        checkpoint_id="c2",
        parent_checkpoint_id="c1",
        checkpoint=Typed("msgpack", b"\x00\xffstate"),
        metadata_json='{"run_id": "r1", "step": 3}',
        channel_versions={"messages": "2"},
        channel_values=[("messages", "2", Typed("json", b"[1, 2]"))],
        writes=[Write("t1", 0, "messages", Typed("json", b"3"), task_path="p")],
        created_at_ms=1234,
    )


def test_a_record_reads_back_as_the_same_checkpoint() -> None:
    cp = _checkpoint()
    record = to_record(cp)
    assert record["metadata"] == {"run_id": "r1", "step": 3}  # JSON, not text, in the archive
    back = from_record("s1", record)
    assert back.metadata_json and from_record("s1", to_record(back)) == back
    assert (back.checkpoint, back.channel_values, back.writes) == (
        cp.checkpoint,
        cp.channel_values,
        cp.writes,
    )


def test_no_metadata_stays_empty() -> None:
    cp = _checkpoint()
    cp.metadata_json = ""
    assert from_record("s1", to_record(cp)).metadata_json == ""


@pytest.mark.parametrize(("value", "required"), [("", True), ("a\x00b", False), ("x" * 1025, False)])
def test_names_that_break_the_layout_are_refused(value: str, required: bool) -> None:
    with pytest.raises(InvalidArgument):
        check_name(value, "namespace", required=required)


def test_an_empty_optional_name_passes() -> None:
    check_name("", "namespace", required=False)
