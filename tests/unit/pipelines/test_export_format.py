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
