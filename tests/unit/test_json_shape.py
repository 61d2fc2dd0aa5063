"""memlane's messages as JSON (``memlane/_json.py``), the one shape the CLI and the MCP tools print:
proto field names, integers as numbers (int64 too, which protobuf's own mapping writes as strings), an
enum by its short lowercase name. Written over every enum of the protos, so one added there is held
to the same spelling with no edit here."""

from __future__ import annotations

import importlib
import pkgutil

from google.protobuf.descriptor import EnumDescriptor

import memlane.v1
from memlane._json import UNKNOWN, enum_name, enum_names, to_json
from memlane.v1 import admin_pb2, memory_pb2, session_pb2


def _enums() -> list[EnumDescriptor]:
    found: list[EnumDescriptor] = []
    for info in pkgutil.iter_modules(memlane.v1.__path__):
        if not info.name.endswith("_pb2"):
            continue
        file = importlib.import_module(f"memlane.v1.{info.name}").DESCRIPTOR
        found.extend(file.enum_types_by_name.values())
        for message in file.message_types_by_name.values():
            found.extend(message.enum_types)
    return found


def test_every_enum_value_has_a_short_lowercase_name_of_its_own() -> None:
    enums = _enums()
    assert len(enums) > 20
    for enum in enums:
        names = [enum_name(enum, v.number) for v in enum.values]
        assert len(set(names)) == len(names), enum.full_name
        for value, name in zip(enum.values, names, strict=True):
            # SESSION_STATUS_CLOSED: closed (the type's prefix dropped, nothing else).
            assert name == name.lower() and value.name.endswith("_" + name.upper()), value.name


def test_integers_are_numbers_and_enums_short_names() -> None:
    session = session_pb2.Session(session_id="s1", status=session_pb2.SESSION_STATUS_CLOSED, token_total=5)
    assert to_json(session) == {"session_id": "s1", "status": "closed", "token_total": 5}
    memory = memory_pb2.Memory(
        memory_id="mem_1",
        kind=memory_pb2.MEMORY_KIND_FACT,
        importance=0.3,
        created_at_unix_ms=1796412220280,
        metadata={"a": "b"},
    )
    assert to_json(memory) == {
        "memory_id": "mem_1",
        "kind": "fact",
        "importance": 0.3,  # the 32-bit float's shortest decimal, not 0.30000001192092896
        "created_at_unix_ms": 1796412220280,
        "metadata": {"a": "b"},
    }
    receipt = admin_pb2.ForgetUserResponse(user_id="u", erased={"redis.messages": 2**40})
    assert to_json(receipt)["erased"] == {"redis.messages": 2**40}


def test_a_value_this_client_does_not_name_is_unknown_and_flags_take_the_names() -> None:
    newer = memory_pb2.MemoryKind.ValueType(max(memory_pb2.MemoryKind.values()) + 1)
    assert to_json(memory_pb2.Memory(kind=newer)) == {"kind": UNKNOWN}
    assert enum_names(session_pb2.SessionStatus) == {"active": 1, "idle": 2, "closed": 3, "expired": 4}
