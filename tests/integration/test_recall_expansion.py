"""Recall's sub-query over a named speaker's own turns (ltm/recall.py), through the real server: a
turn that shares no word with the question and loses to every turn naming the person in the query's
own vector is found only by the sub-query; a sidecar with expansion off (same table) is the control."""

from __future__ import annotations

import pytest

import memlane
from memlane.v1 import memory_pb2 as mpb
from memlane_server.background import SidecarThread
from tests.conftest import ServerFactory

DAY = "[8 May 2023]"
EVIDENCE = f"{DAY} Melanie: I'm off to go swimming with the kids later. Talk to you soon!"
TOPICS = [
    "your school",
    "the summer camp",
    "the library",
    "your town",
    "the community centre",
    "the museum",
    "your neighbourhood",
    "the church group",
    "the youth club",
    "the park",
    "the festival",
    "your office",
    "the gym",
    "the art fair",
    "the book club",
    "the farm",
    "the zoo",
    "the garden club",
    "the theatre",
    "the choir",
    "the charity",
    "the market",
    "the hospital",
    "the shelter",
    "the island",
    "the lake house",
    "the cabin",
    "the retreat",
    "the conference",
    "the workshop",
    "the kids' school",
    "the campus",
    "the studio",
    "the clinic",
    "the coffee shop",
    "the bakery",
    "the ranch",
    "the harbour",
    "the village",
    "the resort",
    "the stadium",
    "the cinema",
    "the planetarium",
    "the aquarium",
    "the old factory",
]
# The other speaker asking Melanie about activities: the query's words and its name, everywhere.
DISTRACTORS = [f"{DAY} Caroline: Melanie, which activities do you partake in at {t}?" for t in TOPICS]
# Melanie's other turns: hers, but about nothing the question asks.
HERS = [
    f"{DAY} Melanie: {text}"
    for text in (
        "Thanks, Caroline, that means a lot to me.",
        "I'm so proud of you for sharing your story.",
        "My mom called me this morning about the weather.",
        "The new shoes I bought are really comfortable.",
        "I think it might rain tomorrow afternoon.",
    )
]
QUESTION = "What activities does Melanie partake in?"


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("ltm"))


def _contents(
    c: memlane.Client,
    who: mpb.Caller,
    query: str,
    limit: int,
    mode: mpb.SearchMode.ValueType = mpb.SEARCH_MODE_HYBRID,
) -> list[str]:
    results = c.search_memories(caller=who, query=query, limit=limit, mode=mode).results
    return [r.memory.content for r in results]


def test_a_named_speakers_turn_is_found_by_the_sub_query(
    start_server: ServerFactory, uri: str, user_id: str
) -> None:
    who = mpb.Caller(user_id=user_id, agent_id="a")
    on: SidecarThread = start_server(ltm_uri=uri)
    with memlane.Client(on.target, timeout=30) as c:
        for text in [*DISTRACTORS, *HERS, EVIDENCE]:
            c.create_memory(caller=who, kind=mpb.MEMORY_KIND_EPISODIC, content=text)
    # Started after the writes, so its view of the shared directory holds them.
    off = start_server(ltm_uri=uri, ltm_recall_expansion=False)
    with memlane.Client(on.target, timeout=30) as c_on, memlane.Client(off.target, timeout=30) as c_off:
        # Without the sub-query the turn is not even a candidate: 40 turns beat it in both retrievers.
        assert EVIDENCE not in _contents(c_off, who, QUESTION, 40)
        assert len(_contents(c_off, who, QUESTION, 40)) == 40  # positive control: the list is full
        assert EVIDENCE in _contents(c_on, who, QUESTION, 5)
        # The sub-query's list is fused, not appended: the other speaker's turns still rank.
        assert any(t.startswith(f"{DAY} Caroline:") for t in _contents(c_on, who, QUESTION, 10))
        # A query naming no speaker is not expanded: both sidecars' vector sides rank alike (compared
        # vector-only: the full-text side of the sidecar that wrote may score from another index state,
        # and the templated turns tie closely).
        vector = mpb.SEARCH_MODE_VECTOR
        for query in ("which activities happen at the museum?", "swimming with the kids"):
            assert _contents(c_on, who, query, 20, vector) == _contents(c_off, who, query, 20, vector), query
        # Positive control: the named query's vector side differs with expansion on.
        assert EVIDENCE in _contents(c_on, who, QUESTION, 5, vector)
        assert EVIDENCE not in _contents(c_off, who, QUESTION, 40, vector)
