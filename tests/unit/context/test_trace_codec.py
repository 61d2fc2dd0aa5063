"""The stored form of a turn trace: score parts of recalled memories round-trip compactly, and traces
stored before parts were kept still decode (their memories have no parts)."""

from __future__ import annotations

import orjson

from memlane_server.access.identity import Caller, CallerRole
from memlane_server.context.model import (
    AssembleRequest,
    AssembleStats,
    Block,
    BlockMessage,
    MemoryRef,
    Provenance,
    Section,
    SectionBudget,
    Truncation,
    TurnTrace,
)
from memlane_server.context.traces import decode_trace, encode_trace
from memlane_server.ltm.model import ScoreParts
from memlane_server.sessions.model import Role

PARTS = ScoreParts(
    keyword_rank=2, keyword_score=1.25, vector_rank=1, vector_similarity=0.625, fused=0.5,
    recency=0.875, usage=0.25, importance=0.75, final=0.4375,
)  # fmt: skip


def a_trace() -> TurnTrace:
    viewer = Caller(agent_id="bot", roles=frozenset({CallerRole.AGENT}), groups=frozenset({"g"}))
    return TurnTrace(
        trace_id="0000000000001-abc",
        session_id="s1",
        created_at_ms=1,
        request=AssembleRequest(session_id="s1", user_input="hi", viewer=viewer),
        blocks=[
            Block(Provenance.PROFILE, 5, [BlockMessage(Role.SYSTEM, "p")], memories=[MemoryRef("m0", 0.9)]),
            Block(
                Provenance.MEMORY,
                7,
                [BlockMessage(Role.SYSTEM, "- a")],
                memories=[MemoryRef("m1", 0.4375, PARTS), MemoryRef("m2", 0.25, ScoreParts(final=0.25))],
            ),
        ],
        stats=AssembleStats(
            trace_id="0000000000001-abc",
            budgets=[SectionBudget(Section.MEMORY, 100, 7)],
            truncations=[Truncation(Section.MEMORY, "cap", 3, 1)],
        ),
    )


def test_score_parts_round_trip() -> None:
    trace = a_trace()
    assert decode_trace(encode_trace(trace)) == trace


def test_score_parts_are_stored_as_a_bare_list() -> None:
    stored = orjson.loads(encode_trace(a_trace()))
    refs = stored["blocks"][1]["memories"]
    assert refs[0]["parts"] == [2, 1.25, 1, 0.625, 0.5, 0.875, 0.25, 0.75, 0.4375]
    assert stored["blocks"][0]["memories"][0]["parts"] is None  # a profile item is not ranked
    assert b"vector_similarity" not in encode_trace(a_trace())


def test_a_trace_stored_before_parts_still_decodes() -> None:
    stored = orjson.loads(encode_trace(a_trace()))
    for block in stored["blocks"]:
        for ref in block["memories"]:
            del ref["parts"]  # the form stored before score parts were kept
    old = decode_trace(orjson.dumps(stored))
    assert [(m.memory_id, m.score, m.parts) for m in old.blocks[1].memories] == [
        ("m1", 0.4375, None),
        ("m2", 0.25, None),
    ]
    assert old.request.viewer.groups == frozenset({"g"})  # the rest decodes as before
