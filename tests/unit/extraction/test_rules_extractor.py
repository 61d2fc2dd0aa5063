"""The offline rules extractor: what it keeps, how it words it, and what it refuses to store."""

from __future__ import annotations

import pytest

from memlane_server.extraction import RulesExtractor, build_episodes
from memlane_server.sessions.model import Message, Role, Session


def extract(*texts: str, role: Role = Role.USER) -> list[tuple[str, str, str]]:
    msgs = [Message(f"m{i}", "s1", role, t, created_at_ms=1_700_000_000_000 + i) for i, t in enumerate(texts)]
    return [(m.kind, m.content, m.slot) for m in RulesExtractor().extract_sync(msgs).memories]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I live in Bangalore.", ("fact", "User lives in Bangalore.", "location")),
        ("Actually I moved to Pune last month.", ("fact", "User lives in Pune.", "location")),
        ("My name is Priya Sharma.", ("fact", "User's name is Priya Sharma.", "name")),
        ("I work as a data engineer.", ("fact", "User works as a data engineer.", "job")),
        ("I'm a software engineer", ("fact", "User is a software engineer.", "job")),
        ("My daughter is named Anika.", ("fact", "User's daughter is named Anika.", "")),
        ("I am vegetarian.", ("fact", "User is vegetarian.", "diet")),
        ("I'm allergic to peanuts.", ("fact", "User is allergic to peanuts.", "")),
        ("I prefer metric units.", ("preference", "User prefers metric units.", "units")),
        ("From now on, use imperial units.", ("instruction", "From now on: use imperial units.", "units")),
        ("Please use celsius.", ("instruction", "Use celsius.", "temperature_unit")),
        ("Always answer in bullet points.", ("instruction", "Always answer in bullet points.", "")),
        ("Never use emojis.", ("instruction", "Never use emojis.", "")),
        (
            "My favorite editor is Neovim.",
            ("preference", "User's favorite editor is Neovim.", "favorite:editor"),
        ),
        ("I hate cilantro.", ("preference", "User dislikes cilantro.", "")),
        ("We decided to use Postgres for billing.", ("fact", "Decision: use Postgres for billing.", "")),
        ("Let's go with the blue theme.", ("fact", "Decision: go with the blue theme.", "")),
    ],
)
def test_extracts(text: str, expected: tuple[str, str, str]) -> None:
    assert expected in extract(text)


def test_two_facts_in_one_sentence() -> None:
    got = extract("I live in Bangalore and I prefer metric units.")
    assert ("fact", "User lives in Bangalore.", "location") in got
    assert ("preference", "User prefers metric units.", "units") in got


@pytest.mark.parametrize(
    "text",
    [
        "Hi there!",
        "Thanks so much!",
        "ok sounds good",
        "Got it.",
        "Where do I live?",
        "Do you know my name",
        "What's the weather in Pune?",
        "I love it.",
        "My email is priya@example.com and I love it.",
        "I live at 221B Baker Street.",
        "My card is 4111 1111 1111 1111, I like paying by card.",
    ],
)
def test_never_stores(text: str) -> None:
    assert extract(text) == []


def test_reads_only_the_user() -> None:
    assert extract("I live in Paris.", role=Role.USER)  # positive control: the user's words are read
    assert extract("I live in Paris.", role=Role.ASSISTANT) == []


def test_restatement_is_stored_once() -> None:
    assert len(extract("I live in Pune.", "As I said, I live in Pune.")) == 1


def test_provenance_and_determinism() -> None:
    msgs = [Message("a1", "s", Role.USER, "Hello!"), Message("a2", "s", Role.USER, "I am vegan.")]
    first = RulesExtractor().extract_sync(msgs).memories
    second = RulesExtractor().extract_sync(msgs).memories
    assert first == second
    assert first[0].source_message_ids == ["a2"]


def test_episodes_one_per_turn_keyed_by_neighbours_and_redacted() -> None:
    msgs = [
        Message(
            "u1",
            "s",
            Role.USER,
            "Book the Goa trip for March, mail me at a@b.io",
            created_at_ms=1_710_000_000_000,
        ),
        Message("a1", "s", Role.ASSISTANT, "Booked: Goa, 3-7 March.", created_at_ms=1_710_000_060_000),
        Message("t1", "s", Role.TOOL, "tool output"),
        Message(
            "u2", "s", Role.USER, "I will pack", participant_name="Priya", created_at_ms=1_710_000_120_000
        ),
        Message("u3", "s", Role.USER, "Thanks! Have a nice day.", created_at_ms=1_710_000_130_000),
    ]
    eps = build_episodes(msgs, Session("s", "u"))
    # Each episode holds exactly one turn, and claims only that turn; pleasantries are no episode.
    assert [e.source_message_ids for e in eps] == [["u1"], ["a1"], ["u2"]]
    assert eps[0].content.startswith("[9 March 2024] User: Book the Goa trip")
    assert eps[2].content == "[9 March 2024] Priya: I will pack"
    assert "[EMAIL]" in eps[0].content and "a@b.io" not in eps[0].content
    assert not any("a@b.io" in k for e in eps for k in e.keywords)
    # Keys: the turn's own keywords, its neighbours' (never served as content), speaker and date.
    assert "Goa" in eps[0].keywords and "booked" in eps[0].keywords
    assert "Goa" in eps[2].keywords and "Goa" not in eps[2].content
    assert {"Priya", "2024-03-09", "Saturday", "March", "2024"} <= set(eps[2].keywords)
    assert eps[0].occurred_at_ms == 1_710_000_000_000
