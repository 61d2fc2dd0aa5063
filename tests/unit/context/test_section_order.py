"""The context sections are listed once (``context.model.SECTION_ORDER``, from the ``Section`` enum)
and everything that walks them (the composer's steps, the wire's caps) follows that list."""

from __future__ import annotations

import dataclasses

from memlane.v1 import context_pb2 as cpb
from memlane_server.access.identity import Caller, enter_caller, exit_caller
from memlane_server.api.context import request_from_pb, request_to_pb
from memlane_server.context.model import SECTION_ORDER, AssembleRequest, Section, SectionCaps, cap_name


def test_the_order_is_the_priority_order_of_the_enum() -> None:
    assert SECTION_ORDER == (Section.SYSTEM, Section.PROFILE, Section.MEMORY, Section.HISTORY)


def test_every_section_has_a_cap_here_and_on_the_wire() -> None:
    names = [cap_name(s) for s in SECTION_ORDER]
    assert names == [f.name for f in dataclasses.fields(SectionCaps)]
    assert [f"{n}_tokens" for n in names] == [f.name for f in cpb.SectionCaps.DESCRIPTOR.fields]


def test_each_cap_crosses_the_wire_into_its_own_section() -> None:
    caps = SectionCaps(system=11, profile=22, memory=33, history=44)
    wire = request_to_pb(AssembleRequest("s1", caps=caps))
    assert (wire.caps.system_tokens, wire.caps.history_tokens) == (11, 44)
    token = enter_caller(Caller("agent"))
    try:
        assert request_from_pb(wire).caps == caps
    finally:
        exit_caller(token)
