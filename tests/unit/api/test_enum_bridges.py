"""Every domain enum that crosses the API maps to its ``memlane.v1`` twin and back (api/enums.py), and a
bridge between enums that disagree is refused when built: int enums by number and name, string enums
(memory kinds and scopes) by name."""

from __future__ import annotations

import enum

import pytest
from google.protobuf import descriptor_pool

from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import session_pb2 as pb
from memlane_server.api.enums import BRIDGES, NAMED_BRIDGES, ROLE, EnumBridge
from memlane_server.errors import InvalidArgument
from memlane_server.memory_kinds import MemoryKind, MemoryScope


@pytest.mark.parametrize("bridge", BRIDGES, ids=lambda b: b.proto_name)
def test_every_member_maps_both_ways(bridge: EnumBridge[enum.IntEnum, int]) -> None:
    proto = {int(v): name for name, v in _values(bridge.proto_name).items()}
    for member in bridge.domain:
        value = bridge.to_pb(member)
        assert int(value) == int(member) and proto[int(value)].endswith("_" + member.name)
        assert bridge.from_pb(value) is member
    for value in proto:  # the proto's every value but a zero the domain leaves out
        if value or bridge.from_pb(0) is not None:
            assert bridge.to_pb(bridge.parse(value, "f")) == value


def test_an_unknown_value_is_the_callers_error() -> None:
    assert ROLE.from_pb(99) is None
    with pytest.raises(InvalidArgument, match="roles\\[\\] 99 is not a known value"):
        ROLE.parse(99, "roles[]")


def test_a_bridge_between_enums_that_disagree_is_refused() -> None:
    class Shifted(enum.IntEnum):
        UNSPECIFIED = 0
        USER = 2  # ROLE_USER is 1

    class Short(enum.IntEnum):
        UNSPECIFIED = 0
        USER = 1  # no ASSISTANT, SYSTEM, TOOL, DEVELOPER

    class Extra(enum.IntEnum):
        UNSPECIFIED = 0
        USER = 1
        ASSISTANT = 2
        SYSTEM = 3
        TOOL = 4
        DEVELOPER = 5
        ROBOT = 6  # not in the proto

    for wrong in (Shifted, Short, Extra):
        with pytest.raises(TypeError):
            EnumBridge(wrong, pb.Role)


@pytest.mark.parametrize("bridge", NAMED_BRIDGES, ids=lambda b: b.proto_name)
def test_every_string_member_maps_both_ways_by_name(bridge: EnumBridge[enum.StrEnum, int]) -> None:
    proto = {int(v): name for name, v in _values(bridge.proto_name).items()}
    for member in bridge.domain:
        value = bridge.to_pb(member)
        assert proto[int(value)].endswith("_" + member.name)
        assert bridge.from_pb(value) is member
    for value in proto:  # every value but the zero one (*_UNSPECIFIED) has its member
        if value:
            assert bridge.to_pb(bridge.parse(value, "f")) == value
    assert bridge.from_pb(0) is None


def test_a_string_enum_missing_a_member_or_with_an_extra_one_is_refused() -> None:
    """What a kind added to the proto but not to ``memory_kinds`` (or the other way round) meets."""

    class Short(enum.StrEnum):  # the proto's MEMORY_KIND_EPISODIC has no member
        FACT = "fact"
        PREFERENCE = "preference"
        INSTRUCTION = "instruction"

    class Extra(enum.StrEnum):  # WORLD has no MEMORY_SCOPE_WORLD
        USER = "user"
        AGENT = "agent"
        GROUP = "group"
        SHARED = "shared"
        WORLD = "world"

    with pytest.raises(TypeError, match="MEMORY_KIND_EPISODIC"):
        EnumBridge(Short, mpb.MemoryKind)
    with pytest.raises(TypeError, match="WORLD has no twin"):
        EnumBridge(Extra, mpb.MemoryScope)
    assert [s.value for s in Extra][:-1] == [s.value for s in MemoryScope]
    assert EnumBridge(MemoryKind, mpb.MemoryKind).to_pb(MemoryKind.FACT) == mpb.MEMORY_KIND_FACT


def _values(full_name: str) -> dict[str, int]:
    enum_type = descriptor_pool.Default().FindEnumTypeByName(full_name)
    return {v.name: v.number for v in enum_type.values}
