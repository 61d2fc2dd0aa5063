"""Budgets: the headroom invariant, as a property over random sessions, budgets and caps.

This drives the same pure pieces ``ContextAssembler`` uses (plan, ledger, block builders, history
selection, the extractive gap summary) in the same order, without Redis.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memlane_server.context import BudgetPolicy, Fallback, Ledger, MemoryHit, Section, SectionCaps, Strategy
from memlane_server.context.budget import plan_budget
from memlane_server.context.compose import (
    MEMORY_HEADING,
    PROFILE_HEADING,
    Costing,
    history_blocks,
    hits_block,
    select_history,
    summary_content,
    text_block,
)
from memlane_server.context.model import Provenance
from memlane_server.errors import InvalidArgument
from memlane_server.sessions.model import Message, Role, Summary
from memlane_server.summarizers import ExtractiveSummarizer
from memlane_server.tokens import MESSAGE_OVERHEAD_TOKENS, TokenCounter

COUNTER = TokenCounter()
GAP = ExtractiveSummarizer(COUNTER)
WORDS = ["order", "ORD-1234", "we", "decided", "must", "plan", "ana@example.com", "hello", "é", "日本", "ok?"]

texts = st.lists(st.sampled_from(WORDS), min_size=0, max_size=60).map(" ".join)
caps = st.builds(
    SectionCaps,
    system=st.integers(0, 400),
    profile=st.integers(0, 200),
    memory=st.integers(0, 400),
    history=st.integers(0, 3000),
)


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[Message], Summary]:
    n = draw(st.integers(0, 60))
    msgs = [
        Message(
            f"m{i}",
            "s",
            Role.USER if i % 2 else Role.ASSISTANT,
            draw(texts),
            seq=i,
            participant_name=draw(st.sampled_from(["", "", "ana", "planner-bot"])),
        )
        for i in range(1, n + 1)
    ]
    through = draw(st.integers(0, n))
    summary = Summary(draw(texts), f"m{through}", through) if through else Summary()
    return msgs, summary


def assemble(
    msgs: list[Message],
    summary: Summary,
    *,
    window: int,
    reserved: int,
    user_input: str,
    caps: SectionCaps,
    strategy: Strategy,
    system: str,
    hits: list[MemoryHit],
    policy: BudgetPolicy,
) -> tuple[list, int]:
    costing = Costing(COUNTER, "")
    input_tokens = costing.message(user_input) if user_input else 0
    plan = plan_budget(window, reserved, input_tokens, caps, policy)
    ledger = Ledger(plan)
    blocks = []
    g = ledger.grant(Section.SYSTEM)
    b = text_block(costing, Provenance.SYSTEM, system, g)
    ledger.spend(Section.SYSTEM, g, b.token_count)
    blocks.append(b)
    for section, prov, heading in (
        (Section.PROFILE, Provenance.PROFILE, PROFILE_HEADING),
        (Section.MEMORY, Provenance.MEMORY, MEMORY_HEADING),
    ):
        g = ledger.grant(section)
        b = hits_block(costing, prov, heading, hits, g)
        ledger.spend(section, g, b.token_count)
        blocks.append(b)
    if strategy in (Strategy.HYBRID, Strategy.ROLLING_SUMMARY):
        cands = [m for m in msgs if m.seq > summary.through_seq]
    else:
        cands = msgs
    costs = [costing.message(m.content, m.participant_name) for m in cands]
    g = ledger.grant(Section.HISTORY)
    hplan = select_history(
        strategy,
        summary,
        cands,
        costs,
        g,
        policy=policy,
        summary_cost=costing.message(summary_content(summary.text, summary.through_seq))
        if summary.text
        else 0,
        window_turns=policy.window_turns,
    )
    if hplan.gap:
        hplan.summary_text = GAP.summarize_sync(hplan.summary_text, hplan.gap, hplan.gap_summary_budget).text
        hplan.summary_through_seq = hplan.gap[-1].seq
    sb, cb = history_blocks(costing, hplan, g)
    ledger.spend(Section.HISTORY, g, sb.token_count + cb.token_count)
    blocks += [sb, cb]
    return blocks, input_tokens


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    session=sessions(),
    window=st.integers(0, 4000),
    reserved=st.integers(0, 1500),
    user_input=texts,
    caps=caps,
    strategy=st.sampled_from([s for s in Strategy if s != Strategy.UNSPECIFIED]),
    system=texts,
    hits=st.lists(
        st.builds(MemoryHit, st.text("abc", min_size=1, max_size=5), texts, st.floats(0, 1)), max_size=8
    ),
    fallback=st.sampled_from([Fallback.GAP_SUMMARY, Fallback.DROPPED_OLDEST]),
    window_turns=st.integers(1, 30),
)
def test_headroom_invariant(
    *,
    session: tuple[list[Message], Summary],
    window: int,
    reserved: int,
    user_input: str,
    caps: SectionCaps,
    strategy: Strategy,
    system: str,
    hits: list[MemoryHit],
    fallback: Fallback,
    window_turns: int,
) -> None:
    msgs, summary = session
    policy = BudgetPolicy(fallback=fallback, window_turns=window_turns)
    try:
        blocks, input_tokens = assemble(
            msgs,
            summary,
            window=window,
            reserved=reserved,
            user_input=user_input,
            caps=caps,
            strategy=strategy,
            system=system,
            hits=hits,
            policy=policy,
        )
    except InvalidArgument:
        # Only when reserved output and the input alone do not fit: then nothing could be assembled.
        assert reserved + (COUNTER.count(user_input) + MESSAGE_OVERHEAD_TOKENS if user_input else 0) > window
        return
    # The invariant.
    assert sum(b.token_count for b in blocks) + input_tokens + reserved <= window
    costing = Costing(COUNTER, "")
    for b in blocks:
        # Token counts are exact, not estimates: recount what the block holds.
        assert b.token_count == sum(costing.message(m.content, m.name) for m in b.messages)
        assert b.token_count <= b.cap_tokens or (b.provenance == Provenance.CONVERSATION)
    # Caps hold per section.
    if caps.system:
        assert blocks[0].token_count <= caps.system
    if caps.memory:
        assert blocks[2].token_count <= caps.memory
    if caps.history:
        assert blocks[3].token_count + blocks[4].token_count <= caps.history
    # The conversation is a contiguous run of the newest turns, in order.
    kept = [m.seq for m in blocks[4].messages]
    assert kept == sorted(kept)
    if kept and strategy != Strategy.SLIDING_WINDOW:
        assert kept[-1] == msgs[-1].seq


def test_priority_order_lowest_section_absorbs_the_shortfall() -> None:
    policy = BudgetPolicy()
    plan = plan_budget(1000, 200, 0, SectionCaps(system=700, history=900), policy)
    ledger = Ledger(plan)
    assert ledger.grant(Section.SYSTEM) == 700
    ledger.spend(Section.SYSTEM, 700, 700)
    assert ledger.grant(Section.PROFILE) == min(policy.profile_max, int(800 * policy.profile_share))
    ledger.spend(Section.PROFILE, 40, 40)
    ledger.spend(Section.MEMORY, ledger.grant(Section.MEMORY), 60)
    assert ledger.grant(Section.HISTORY) == 0  # history gets what is left: nothing
    with pytest.raises(AssertionError):
        ledger.spend(Section.HISTORY, 0, 1)


def test_reserved_output_beyond_window_is_invalid() -> None:
    with pytest.raises(InvalidArgument):
        plan_budget(1000, 1001, 0, SectionCaps(), BudgetPolicy())
