"""Sub-queries of recall (ltm/recall.py) and the speaker rule they share with focus (ltm/words.py):
who a query names, what is left to ask once names are out, and one rule whether a row is read alone
(Python) or a whole column at once (Arrow)."""

from __future__ import annotations

import pyarrow as pa

from memlane_server.ltm.recall import SubQuery, sub_query, without_names
from memlane_server.ltm.words import named_in, speaker_column, speaker_of_item
from memlane_server.memory_kinds import MemoryKind

SPEAKERS = {"Melanie", "Caroline"}


def test_the_topic_is_asked_among_the_named_speakers_turns() -> None:
    assert sub_query("What activities does Melanie partake in?", SPEAKERS) == SubQuery(
        "What activities does partake in", ("Melanie",)
    )
    # A possessive goes with the name; both people named: one sub-query over both.
    assert sub_query("What are Melanie's pets' names?", SPEAKERS) == SubQuery(
        "What are pets names", ("Melanie",)
    )
    both = sub_query("What have Caroline and Melanie both painted?", SPEAKERS)
    assert both is not None and both.speakers == (
        "Caroline",
        "Melanie",
    )


def test_nothing_is_added_without_a_named_speaker_or_a_topic() -> None:
    assert sub_query("What activities does the user like?", SPEAKERS) is None
    assert sub_query("Who is Melanie?", SPEAKERS) is None  # nothing asked about but the person
    assert sub_query("melanie", SPEAKERS) is None
    # Role words name nobody (memories are written about "the user").
    assert sub_query("What does the user like to cook?", {"User", "Assistant"}) is None
    # A name is matched whole: "Mel" does not name "Melanie".
    assert sub_query("What does Mel paint?", SPEAKERS) is None


def test_names_are_whole_words_case_folded() -> None:
    assert named_in("what did ADA LOVELACE write", {"Ada Lovelace", "Ada"}) == {"Ada Lovelace", "Ada"}
    assert named_in("what did Ada write", {"Ada Lovelace", "Ada"}) == {"Ada"}
    assert without_names("Did Ada's sister visit ada?", frozenset({"ada"})) == "Did sister visit"


def test_the_column_rule_is_the_row_rule() -> None:
    rows = [
        (MemoryKind.EPISODIC, "[3 May 2023] Caroline: I went to a support group."),
        (MemoryKind.EPISODIC, "José Ñandú: hola"),
        (MemoryKind.EPISODIC, "[1 May] Ada Lovelace: the engine runs"),
        (MemoryKind.EPISODIC, "We debugged the Redis failover: Sentinel promoted a replica."),
        (MemoryKind.EPISODIC, "User lives in Pune."),
        (MemoryKind.EPISODIC, "O'Neil-Smith Jr.: fine"),
        (MemoryKind.INSTRUCTION, "From now on: use imperial."),
        (MemoryKind.FACT, "Ada: likes tea"),
        (MemoryKind.EPISODIC, ""),
    ]
    table = pa.table({"kind": [k.value for k, _ in rows], "content": [c for _, c in rows]})
    expected = [speaker_of_item(k, c) or None for k, c in rows]
    assert expected[:3] == ["Caroline", "José Ñandú", "Ada Lovelace"]  # positive controls
    assert speaker_column(table).to_pylist() == expected
