"""The user export's file format (pipelines/user_data.py): what ExportUserData writes, ImportUserData
reads back line for line, and a file it cannot read whole is refused, never half read."""

from __future__ import annotations

import orjson
import pytest

from memlane_server.errors import FailedPrecondition, InvalidArgument
from memlane_server.pipelines import user_data as export_format


def _file(*lines: dict[str, object]) -> bytes:
    return b"\n".join(orjson.dumps(line) for line in lines) + b"\n"


def test_written_lines_read_back_with_their_types_and_line_numbers() -> None:
    record = {"record": "ignored", "session_id": "s1", "n": 2}
    data = _file(export_format.header("ana"), export_format.tagged("session", record))
    parsed = export_format.parse(data)
    assert parsed.user_id == "ana"
    assert parsed.format_version == export_format.FORMAT_VERSION
    assert parsed.records == [(2, "session", {"session_id": "s1", "n": 2})]


def test_a_tagged_record_names_its_type_first() -> None:
    line = export_format.tagged("memory", {"id": "m1", "record": "session"})
    assert list(line) == ["record", "memory_id"] and line["record"] == "memory"


def test_a_newer_format_is_refused_not_half_read() -> None:
    head = {**export_format.header("ana"), "format_version": export_format.FORMAT_VERSION + 1}
    with pytest.raises(FailedPrecondition, match="newer memlane"):
        export_format.parse(_file(head, export_format.tagged("session", {})))


@pytest.mark.parametrize(
    ("data", "fault"),
    [
        (b"", "no lines"),
        (b"not json\n", "line 1 is not JSON"),
        (_file({"record": "session"}), "not the header"),
        (_file(export_format.header("ana"), export_format.header("ana")), "second header"),
        (_file(export_format.header("ana"), {"id": "x"}), "line 2 has no 'record'"),
    ],
)
def test_a_broken_file_names_the_line_at_fault(data: bytes, fault: str) -> None:
    with pytest.raises(InvalidArgument, match=fault):
        export_format.parse(data)


def test_version_two_names_read_back_as_the_stored_names() -> None:
    """Version 2 writes the API's names (``memory_id``, ``*_unix_ms``, a version's ``memory``, a
    session's status by name) and the reader gives the import the stored names back, as version 1 had
    them; records the API does not show (a checkpoint, a framework's object) keep their own fields."""
    stored = {
        "session": {"session_id": "s1", "status": 3, "topology": 1, "created_at_ms": 7},
        "memory": {"id": "m1", "kind": "fact", "created_at_ms": 5, "valid_until_ms": 0},
        "memory_version": {"memory_id": "m1", "changed_at_ms": 6, "item": {"id": "m1", "updated_at_ms": 6}},
        "memory_snapshot": {"snapshot_id": "x", "created_at_ms": 8, "items": [{"id": "m1"}]},
        "checkpoint": {"id": "c1", "ts_ms": 9},
    }
    lines = [export_format.tagged(kind, record) for kind, record in stored.items()]
    assert lines[0]["status"] == "closed" and lines[0]["created_at_unix_ms"] == 7
    assert lines[1]["memory_id"] == "m1" and "id" not in lines[1]
    assert lines[2]["memory"] == {"memory_id": "m1", "updated_at_unix_ms": 6}
    assert lines[3]["items"] == [{"memory_id": "m1"}] and lines[4] == {
        "record": "checkpoint",
        **stored["checkpoint"],
    }
    parsed = export_format.parse(_file(export_format.header("ana"), *lines))
    assert parsed.format_version == 2
    assert [(kind, fields) for _, kind, fields in parsed.records] == list(stored.items())


def test_a_version_one_file_is_read_as_written() -> None:
    head = {**export_format.header("ana"), "format_version": 1}
    old = {"record": "memory", "id": "m1", "created_at_ms": 5}
    assert export_format.parse(_file(head, old)).records == [(2, "memory", {"id": "m1", "created_at_ms": 5})]


@pytest.mark.parametrize(
    ("record", "fault"),
    [
        ({"record": "memory", "memory_id": "m1", "id": "m2"}, "line 2: memory names the field 'id' twice"),
        ({"record": "session", "status": "asleep"}, "line 2: session status 'asleep' is none of"),
    ],
)
def test_a_version_two_record_that_cannot_be_read_back_is_refused(
    record: dict[str, object], fault: str
) -> None:
    with pytest.raises(InvalidArgument, match=fault):
        export_format.parse(_file(export_format.header("ana"), record))
