"""Every domain enum that crosses the API maps to its ``memlane.v1`` twin and back (api/enums.py), and a
bridge between enums that disagree is refused when built."""

from __future__ import annotations

import enum

import pytest
from google.protobuf import descriptor_pool

from memlane.v1 import session_pb2 as pb
from memlane_server.api.enums import BRIDGES, ROLE, EnumBridge
from memlane_server.errors import InvalidArgument


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


def _values(full_name: str) -> dict[str, int]:
    enum_type = descriptor_pool.Default().FindEnumTypeByName(full_name)
    return {v.name: v.number for v in enum_type.values}
