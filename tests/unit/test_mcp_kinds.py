"""The MCP tools' memory kinds come from the proto enum (``memlane.mcp._tools``): every kind the proto
names is offered by the schema and accepted, a kind the client does not know is answered as such, not as
a fact. Written over the enum, so a kind added to the proto needs no edit here."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from memlane.mcp._tools import UNKNOWN_KIND, ListMemories, MemoryOut, Remember, SearchMemories, _memory
from memlane.v1.memory_pb2 import Memory, MemoryKind

NAMES = {v: n.removeprefix("MEMORY_KIND_").lower() for n, v in MemoryKind.items() if v}


def _enum(schema: dict[str, Any], field: str) -> list[str]:
    prop = schema["properties"][field]
    return list((prop.get("items") or prop)["enum"])


def test_every_kind_of_the_proto_is_offered_and_read_back_by_its_name() -> None:
    for model in (SearchMemories, ListMemories):
        assert _enum(model.model_json_schema(), "kinds") == list(NAMES.values())
    assert _enum(Remember.model_json_schema(), "kind") == [n for n in NAMES.values() if n != "episodic"]
    assert _enum(MemoryOut.model_json_schema(), "kind") == [*NAMES.values(), UNKNOWN_KIND]
    for value, name in NAMES.items():
        assert _memory(Memory(memory_id="m", kind=value))["kind"] == name
        assert SearchMemories.model_validate({"query": "q", "kinds": [name]}).kinds == [name]


def test_a_kind_the_client_does_not_know_is_neither_taken_nor_shown_as_a_fact() -> None:
    newer = MemoryKind.ValueType(max(NAMES) + 1)  # a kind of a newer sidecar's proto
    assert _memory(Memory(memory_id="m", kind=newer))["kind"] == UNKNOWN_KIND
    with pytest.raises(ValidationError, match="kind must be one of"):
        SearchMemories.model_validate({"query": "q", "kinds": ["secret"]})
    with pytest.raises(ValidationError, match="kind must be one of"):
        Remember.model_validate({"content": "x", "kind": "episodic"})  # episodes come from turns
    assert Remember.model_validate({"content": "x"}).kind == "fact"
