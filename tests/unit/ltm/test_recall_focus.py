"""The result list shaped by who the query is about (ltm/recall.py): a named speaker's own turns rise, a
query naming nobody (or everybody) is left alone, and a turn with no content gives way."""

from __future__ import annotations

from memlane_server.ltm.model import MemoryItem, ScoredMemory, ScoreParts
from memlane_server.ltm.recall import focus
from memlane_server.ltm.words import speaker_of
from memlane_server.memory_kinds import MemoryKind, MemoryScope


def _hit(i: int, content: str, score: float) -> ScoredMemory:
    item = MemoryItem(f"m{i}", "u", "a", MemoryScope.AGENT, MemoryKind.EPISODIC, content)
    return ScoredMemory(item, score, ScoreParts(final=score))


CONVERSATION = [
    _hit(1, "[3 May 2023] Ben: Ada, your dog Pixel is adorable and fast!", 1.0),
    _hit(2, "[3 May 2023] Ada: Pixel loves the beach and long runs.", 0.9),
    _hit(3, "[4 May 2023] Ben: I took my cat Misu to the vet today.", 0.5),
]


def _ids(results: list[ScoredMemory]) -> list[str]:
    return [r.item.id for r in results]


def test_speaker_is_read_from_an_episode() -> None:
    assert speaker_of("[3 May 2023] Ada: hello") == "Ada"
    assert speaker_of("Ada Lovelace: hello") == "Ada Lovelace"
    assert speaker_of("User lives in Pune.") == ""
    assert speaker_of("We debugged the Redis failover: Sentinel promoted a replica.") == ""


def test_a_named_speakers_own_turn_rises() -> None:
    assert _ids(focus("What does Ada's dog love?", CONVERSATION, 3))[0] == "m2"
    # Positive controls: without a name, or naming everyone, fusion's order stands.
    assert _ids(focus("what does the dog love", CONVERSATION, 3)) == ["m1", "m2", "m3"]
    assert _ids(focus("what did Ada and Ben say", CONVERSATION, 3)) == ["m1", "m2", "m3"]
    assert _ids(focus("What does Ada's dog love?", CONVERSATION, 1)) == ["m2"]


def test_a_turn_without_content_gives_way() -> None:
    hits = [
        _hit(1, "[5 May 2023] Ben: Thanks, Ada!", 1.0),
        _hit(2, "[5 May 2023] Ben: The vet said Misu needs a special diet now.", 0.8),
    ]
    assert _ids(focus("what did the vet say", hits, 2)) == ["m2", "m1"]
    # Facts (no speaker) are never damped, however short.
    facts = [_hit(1, "User likes tea.", 1.0), _hit(2, "User's cat Misu needs a special diet.", 0.8)]
    assert _ids(focus("what does the user like", facts, 2)) == ["m1", "m2"]


def test_role_names_are_not_people() -> None:
    chat = [
        _hit(1, "[5 May 2023] Assistant: Bangalore has lovely weather in May.", 1.0),
        _hit(2, "[5 May 2023] User: I live in Bangalore.", 0.9),
    ]
    assert _ids(focus("where does the user live", chat, 2)) == ["m1", "m2"]


def test_only_episodes_are_spoken_turns() -> None:
    item = MemoryItem("m1", "u", "a", MemoryScope.AGENT, MemoryKind.INSTRUCTION, "From now on: use imperial.")
    rules = [
        ScoredMemory(item, 1.0, ScoreParts(final=1.0)),
        _hit(2, "[1 May 2023] Ada: the units are fine", 0.9),
    ]
    assert _ids(focus("which units", rules, 2)) == ["m1", "m2"]
    assert focus("which units", rules, 2)[0].score == 1.0  # not damped as a thin turn
