"""The headroom invariant as a property of the real pure assembly core (``context.core.compose``, the
steps the streaming assembler runs), over random sessions, memories, budgets, caps, strategies,
visibilities and gap summaries; ``tests/integration/test_headroom.py`` checks the same through the server.

Whatever the sections hold, the blocks plus the input plus the reserved output fit the window; token
counts are exact; each section stays within its cap; the conversation is the newest readable turns.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from memlane_server.access.identity import Caller
from memlane_server.config import Settings
from memlane_server.context import (
    AssembleRequest,
    Fallback,
    MemoryHit,
    Provenance,
    Section,
    SectionCaps,
)
from memlane_server.context import Strategy as S
from memlane_server.context.compose import Costing
from memlane_server.context.core import Composition, Gathered, GatheredHistory, compose, settle
from memlane_server.context.model import GapFold
from memlane_server.errors import InvalidArgument
from memlane_server.sessions.model import ChannelPolicy, Message, Role, Session, Summary, VisibilityKind
from memlane_server.tokens import TokenCounter
from memlane_server.wiring.lifecycle import budget_policy

COUNTER = TokenCounter()
WORDS = ["order", "ORD-1234", "we", "decided", "must", "plan", "hello", "é", "日本", "ok?", "ana@example.com"]
VIEWER = Caller(agent_id="me")
texts = st.lists(st.sampled_from(WORDS), min_size=0, max_size=60).map(" ".join)
turn_texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=60).map(" ".join)
hits = st.lists(st.builds(MemoryHit, st.uuids().map(str), turn_texts, st.floats(0, 1)), max_size=6)


def _turns(data: st.DataObject, n: int) -> list[Message]:
    """Turns of this viewer and of another agent, some of them private to their agent."""
    return [
        Message(
            message_id=f"m{i}",
            session_id="s",
            role=Role.USER if i % 2 else Role.ASSISTANT,
            content=data.draw(turn_texts),
            seq=i,
            participant_name=data.draw(st.sampled_from(["", "", "ana", "planner-bot"])),
            source_agent_id=data.draw(st.sampled_from(["me", "me", "other"])),
            visibility=data.draw(st.sampled_from([VisibilityKind.SESSION] * 3 + [VisibilityKind.AGENT])),
        )
        for i in range(1, n + 1)
    ]


def _gathered(
    session: Session, turns: list[Message], strategy: S, window_turns: int, model: str
) -> GatheredHistory:
    """What the history read hands the core: the turns after the summary (summary strategies), the
    last few (sliding window) or all, and the content tokens of those the viewer may read."""
    if strategy in (S.HYBRID, S.ROLLING_SUMMARY):
        cands = [m for m in turns if m.seq > session.summary.through_seq]
    elif strategy == S.SLIDING_WINDOW:
        cands = turns[-window_turns:]
    else:
        cands = turns
    readable = [m for m in cands if VIEWER.can_see(m.visibility, m.source_agent_id, m.visibility_group)]
    return GatheredHistory(cands, readable, COUNTER.count_many([m.content for m in readable], model))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    n=st.integers(0, 40),
    window=st.integers(1, 4000),
    reserved=st.integers(1, 1500),
    user_input=texts,
    input_is_last_turn=st.booleans(),
    caps=st.builds(
        SectionCaps, st.integers(0, 400), st.integers(0, 200), st.integers(0, 400), st.integers(0, 3000)
    ),
    strategy=st.sampled_from([S.FULL_BUFFER, S.SLIDING_WINDOW, S.ROLLING_SUMMARY, S.HYBRID]),
    system=texts,
    fallback=st.sampled_from([Fallback.GAP_SUMMARY, Fallback.DROPPED_OLDEST]),
    window_turns=st.integers(1, 30),
    profile=hits,
    memories=hits,
)
def test_headroom_invariant_of_the_pure_core(
    *,
    data: st.DataObject,
    n: int,
    window: int,
    reserved: int,
    user_input: str,
    input_is_last_turn: bool,
    caps: SectionCaps,
    strategy: S,
    system: str,
    fallback: Fallback,
    window_turns: int,
    profile: list[MemoryHit],
    memories: list[MemoryHit],
) -> None:
    policy = replace(budget_policy(Settings().context), fallback=fallback)
    turns = _turns(data, n)
    if user_input and input_is_last_turn:  # the input already stored, as the viewer's own turn
        turns.append(Message(f"m{n + 1}", "s", Role.USER, user_input, seq=n + 1, source_agent_id="me"))
    through = data.draw(st.integers(0, len(turns)))
    summary = Summary(data.draw(turn_texts), f"m{through}", through, 5) if through else Summary()
    session = Session("s", "u", summary=summary, last_seq=len(turns), message_count=len(turns))
    req = AssembleRequest(
        "s",
        user_input,
        context_window=window,
        reserved_output=reserved,
        caps=caps,
        strategy=strategy,
        window_turns=window_turns,
        viewer=VIEWER,
    )
    input_cost = Costing(COUNTER, "").message(user_input) if user_input else 0
    channel = ChannelPolicy()
    if reserved + input_cost > window:
        event("rejected")
        with pytest.raises(InvalidArgument, match="exceed the context window"):
            settle(
                req, session, policy=policy, channel=channel, counter=COUNTER, default_model="", trace_id="t"
            )
        return
    s = settle(req, session, policy=policy, channel=channel, counter=COUNTER, default_model="", trace_id="t")
    history = _gathered(session, turns, strategy, window_turns, s.model)

    def fold(gap: GapFold) -> Summary:
        event("gap folded")
        assert gap.leaving and gap.leaving[-1].seq > gap.previous.through_seq
        # Whatever the summarizer returns, the blocks must still fit.
        return Summary(data.draw(texts), gap.leaving[-1].message_id, gap.leaving[-1].seq)

    out = compose(
        s, Gathered(system, profile, memories, history), policy=policy, max_summary_tokens=8192, fold_gap=fold
    )
    blocks, stats = out.blocks, out.stats
    last = history.readable[-1] if history.readable else None
    stored_input = (
        input_cost > 0 and last is not None and (last.role, last.content) == (Role.USER, user_input)
    )
    event(f"input already stored: {stored_input}")
    assert stats.input_tokens == (0 if stored_input else input_cost)

    assert [b.provenance for b in blocks] == [1, 2, 3, 4, 5]
    assert sum(b.token_count for b in blocks) == stats.total_tokens
    assert stats.total_tokens + stats.input_tokens + reserved <= window
    assert stats.headroom_tokens == window - reserved - stats.input_tokens - stats.total_tokens >= 0
    costing = Costing(COUNTER, stats.model)
    for b in blocks:
        assert b.token_count == sum(costing.message(m.content, m.name) for m in b.messages)
        assert b.token_count <= b.cap_tokens or b.provenance == Provenance.CONVERSATION
    system_block, profile_block, memory_block, summary_block, conversation = blocks
    for cap, block in (
        (caps.system, system_block),
        (caps.profile, profile_block),
        (caps.memory, memory_block),
    ):
        assert not cap or block.token_count <= cap
    if caps.history:
        assert summary_block.token_count + conversation.token_count <= caps.history
    kept = [m.seq for m in conversation.messages]
    readable = [m.seq for m in history.readable]
    assert kept == readable[len(readable) - len(kept) :]  # the newest readable turns, in order


def _settled(user_input: str, turns: list[Message], window: int) -> tuple[Composition, GatheredHistory]:
    session = Session("s", "u", last_seq=len(turns), message_count=len(turns))
    req = AssembleRequest("s", user_input, context_window=window, reserved_output=10, strategy=S.FULL_BUFFER)
    s = settle(
        req,
        session,
        policy=budget_policy(Settings().context),
        channel=ChannelPolicy(),
        counter=COUNTER,
        default_model="",
        trace_id="t",
    )
    tokens = COUNTER.count_many([m.content for m in turns], s.model)
    return Composition(s, budget_policy(Settings().context), 8192), GatheredHistory(turns, turns, tokens)


def test_an_input_already_stored_is_charged_once_and_its_budget_goes_to_history() -> None:
    """Positive control of the branch the property reaches: the stored input frees its tokens, so a
    window with room for the input plus one turn holds it; an unstored twin turn does not fit."""
    text = "we decided the plan " * 20
    cost = Costing(COUNTER, "").message(text)
    for last, stored in ((text, True), (text + "!", False)):
        c, history = _settled(text, [Message("m1", "s", Role.USER, last, seq=1)], 10 + 2 * cost - 5)
        c.system("")
        c.hits(Section.PROFILE, [])
        c.hits(Section.MEMORY, [])
        assert c.history(history) is None
        _, conversation = c.history_blocks()
        stats = c.finish()
        assert stats.input_tokens == (0 if stored else cost)
        assert len(conversation.messages) == (1 if stored else 0)


def test_steps_out_of_order_are_refused() -> None:
    c, _ = _settled("hi", [], 1000)
    with pytest.raises(AssertionError, match="out of order"):
        c.hits(Section.MEMORY, [])
