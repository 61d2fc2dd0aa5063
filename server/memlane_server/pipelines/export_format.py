"""The user export's file format (ExportUserData writes it, ImportUserData reads it; described for people
in docs/operations.md#export-format).

JSON lines. The first line is the header: ``{"record": "header", "format": "memlane.user-export",
"format_version": 1, "memlane_version": ..., "user_id": ..., "exported_at_ms": ...}``. Every other line
is one record, an object whose ``record`` field names its type (``session``, ``message``, ``trace``,
``checkpoint``, ``memory``, ``memory_version``, ``memory_snapshot``, ``procedure``,
``archive.<dataset>``) beside the record's own fields.

A reader accepts its own format version and older ones; a newer file is refused (a field it cannot read
may carry meaning), never half read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

import memlane

from ..errors import FailedPrecondition, InvalidArgument
from ..ids import check_id

FORMAT = "memlane.user-export"
FORMAT_VERSION = 1
TYPE_FIELD = "record"
HEADER = "header"


def header(user_id: str) -> dict[str, Any]:
    return {
        TYPE_FIELD: HEADER,
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "memlane_version": memlane.__version__,
        "user_id": user_id,
        "exported_at_ms": time.time_ns() // 1_000_000,
    }


def tagged(kind: str, record: dict[str, Any]) -> dict[str, Any]:
    """The record as a line holds it: its type first, then its own fields."""
    return {TYPE_FIELD: kind, **{k: v for k, v in record.items() if k != TYPE_FIELD}}


@dataclass(frozen=True, slots=True)
class ExportFile:
    user_id: str
    format_version: int
    records: list[tuple[int, str, dict[str, Any]]]  # (line number, type, fields without the type)


def parse(data: bytes) -> ExportFile:
    """Reads whole lines; raises InvalidArgument naming the line at fault, FailedPrecondition for a
    format newer than this sidecar reads."""
    lines = data.split(b"\n")
    records: list[tuple[int, str, dict[str, Any]]] = []
    head: dict[str, Any] | None = None
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise InvalidArgument(f"line {number} is not JSON", field="data") from None
        kind = obj.get(TYPE_FIELD) if isinstance(obj, dict) else None
        if not isinstance(kind, str) or not kind:
            raise InvalidArgument(f"line {number} has no {TYPE_FIELD!r} field naming its type", field="data")
        if head is None:
            head = _header(obj, number)
            continue
        if kind == HEADER:
            raise InvalidArgument(f"line {number} is a second header", field="data")
        records.append((number, kind, {k: v for k, v in obj.items() if k != TYPE_FIELD}))
    if head is None:
        raise InvalidArgument("data holds no lines: an export starts with its header line", field="data")
    return ExportFile(head["user_id"], head["format_version"], records)


def _header(obj: dict[str, Any], number: int) -> dict[str, Any]:
    if obj.get(TYPE_FIELD) != HEADER or obj.get("format") != FORMAT:
        raise InvalidArgument(
            f"line {number} is not the header of a memlane user export (format {FORMAT!r}); files"
            " written before the format had a header are not read",
            field="data",
        )
    version = obj.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidArgument("the header's format_version is not a positive integer", field="data")
    if version > FORMAT_VERSION:
        writer = str(obj.get("memlane_version"))[:40]
        raise FailedPrecondition(
            f"the file is format version {version}, written by memlane {writer!r}; this sidecar reads up"
            f" to version {FORMAT_VERSION}: import it with a newer memlane"
        )
    user_id = obj.get("user_id")
    if not isinstance(user_id, str):
        raise InvalidArgument("the header names no user_id", field="data")
    check_id(user_id, "header.user_id")
    return obj
