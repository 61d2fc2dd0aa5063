"""The extractive summarizer: what it keeps verbatim, incremental merging, budgets, determinism."""

from __future__ import annotations

import pytest

from memlane_server.sessions.model import Message, Role
from memlane_server.summarizers import ExtractiveSummarizer
from memlane_server.tokens import TokenCounter


@pytest.fixture(scope="module")
def summarizer() -> ExtractiveSummarizer:
    return ExtractiveSummarizer(TokenCounter())


def _m(seq: int, role: Role, content: str) -> Message:
    return Message(f"m{seq}", "s", role, content, seq=seq)


TURNS = [
    _m(1, Role.USER, "Hi there, hope your week is going well."),
    _m(2, Role.ASSISTANT, "Thanks! How can I help today."),
    _m(3, Role.USER, "We decided to go with the annual plan. The colours look nice."),
    _m(4, Role.USER, "My order number is ORD-88231 and you can reach me at ana@example.com."),
    _m(5, Role.USER, "The budget must stay under $400. Delivery by 2025-05-03 would be ideal."),
    _m(6, Role.ASSISTANT, "Noted. The tracking page is https://shop.example.com/t/88231 for reference."),
    _m(7, Role.USER, "Can you also check whether the warranty covers water damage?"),
]


def test_keeps_decisions_constraints_identifiers_and_open_items_verbatim(
    summarizer: ExtractiveSummarizer,
) -> None:
    r = summarizer.summarize_sync("", TURNS, 400)
    for verbatim in (
        "We decided to go with the annual plan.",
        "My order number is ORD-88231 and you can reach me at ana@example.com.",
        "The budget must stay under $400.",
        "https://shop.example.com/t/88231",
        "Can you also check whether the warranty covers water damage?",
    ):
        assert verbatim in r.text
    assert "Decisions:" in r.text and "Open items:" in r.text
    assert r.token_count <= 400 and r.provider == "extractive"
    assert r.tokens_in > 0 and r.tokens_out == r.token_count


def test_answered_questions_are_not_open_items(summarizer: ExtractiveSummarizer) -> None:
    turns = [
        _m(1, Role.USER, "Could you compare the two options?"),
        _m(2, Role.ASSISTANT, "Sure, here it is."),
    ]
    unanswered = summarizer.summarize_sync("", turns[:1], 200).text
    assert "Open items:" in unanswered  # positive control: the same question, left open, is listed
    text = summarizer.summarize_sync("", turns, 200).text
    assert "Open items:" not in text


def test_merges_with_previous_summary_without_the_old_turns(summarizer: ExtractiveSummarizer) -> None:
    first = summarizer.summarize_sync("", TURNS[:4], 400)
    second = summarizer.summarize_sync(first.text, TURNS[4:], 400)
    # Facts from turns 1-4 survive although only turns 5-7 were passed in the second call.
    assert "ORD-88231" in second.text and "annual plan" in second.text
    assert "$400" in second.text
    # Merging is idempotent on repeated items (no duplicates).
    assert second.text.count("ORD-88231 and you can reach") == 1


def test_foreign_previous_summary_is_classified_sentence_by_sentence(
    summarizer: ExtractiveSummarizer,
) -> None:
    previous = "The user chose plan B. Their ticket is TCK-4411. They like jazz."
    text = summarizer.summarize_sync(previous, [_m(9, Role.USER, "Thanks, that is all.")], 300).text
    assert "The user chose plan B." in text and "TCK-4411" in text


@pytest.mark.parametrize("budget", [0, 5, 30, 60, 120])
def test_respects_budget_and_drops_context_before_verbatim_items(
    summarizer: ExtractiveSummarizer, budget: int
) -> None:
    counter = TokenCounter()
    r = summarizer.summarize_sync("", TURNS, budget)
    assert counter.count(r.text) <= budget
    if budget >= 30:
        # The decision is the most valuable item: it survives every budget that can hold it.
        assert "annual plan" in r.text
        assert "hope your week" not in r.text  # small talk goes first


def test_is_deterministic(summarizer: ExtractiveSummarizer) -> None:
    assert summarizer.summarize_sync("", TURNS, 90).text == summarizer.summarize_sync("", TURNS, 90).text


async def test_async_summarize_matches_sync(summarizer: ExtractiveSummarizer) -> None:
    r = await summarizer.summarize("", TURNS, 200)
    assert r.text == summarizer.summarize_sync("", TURNS, 200).text
