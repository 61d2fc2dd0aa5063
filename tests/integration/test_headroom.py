"""The headroom invariant, as a property over random sessions, memories, budgets and caps, checked on
what the real server assembles (the real ``ContextAssembler`` over real Redis, LanceDB and tiktoken).

Whatever the sections hold, the blocks plus the input plus the reserved output fit the window; token
counts are exact; each section stays within its cap; the conversation is the newest turns, in order.
``tests/unit/test_assembly_core.py`` checks the same on the pure core itself, with many more examples.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import memlane
from memlane import Message, Role
from memlane.v1 import context_pb2 as cpb
from memlane.v1 import memory_pb2 as mpb
from memlane_server.context.compose import Costing
from memlane_server.tokens import TokenCounter
from tests.conftest import ServerFactory

COUNTER = TokenCounter()
# No e-mail address among the memory words: the PII guard would (rightly) refuse those items.
MEMORY_WORDS = ["order", "ORD-1234", "we", "decided", "must", "plan", "hello", "é", "日本", "ok?"]
WORDS = [*MEMORY_WORDS, "ana@example.com"]
STRATEGIES = [
    cpb.CONTEXT_STRATEGY_FULL_BUFFER,
    cpb.CONTEXT_STRATEGY_SLIDING_WINDOW,
    cpb.CONTEXT_STRATEGY_ROLLING_SUMMARY,
    cpb.CONTEXT_STRATEGY_HYBRID,
]
FALLBACKS = ["gap_summary", "drop_oldest"]

texts = st.lists(st.sampled_from(WORDS), min_size=0, max_size=60).map(" ".join)
# A stored turn always has content (the server rightly refuses an empty one).
turn_texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=60).map(" ".join)
memory_texts = st.lists(st.sampled_from(MEMORY_WORDS), min_size=1, max_size=20).map(
    lambda ws: "User notes: " + " ".join(ws) + "."
)
caps = st.builds(
    cpb.SectionCaps,
    system_tokens=st.integers(0, 400),
    profile_tokens=st.integers(0, 200),
    memory_tokens=st.integers(0, 400),
    history_tokens=st.integers(0, 3000),
)


@pytest.fixture(scope="module")
def clients(start_server: ServerFactory) -> Iterator[dict[str, memlane.Client]]:
    """One sidecar per history fallback (a server setting), each with long-term memory on."""
    out = {f: memlane.Client(start_server(context_fallback=f).target, timeout=30) for f in FALLBACKS}
    yield out
    for c in out.values():
        c.close()


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[Message], int, str]:
    """Turns, how many of them a stored summary covers (0: none), and the summary's text."""
    n = draw(st.integers(0, 40))
    msgs = [
        Message(
            role=Role.ROLE_USER if i % 2 else Role.ROLE_ASSISTANT,
            content=draw(turn_texts),
            participant_name=draw(st.sampled_from(["", "", "ana", "planner-bot"])),
        )
        for i in range(1, n + 1)
    ]
    through = draw(st.integers(0, n))
    return msgs, through, draw(turn_texts) if through else ""


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    session=sessions(),
    memories=st.lists(
        st.tuples(
            st.sampled_from([mpb.MEMORY_KIND_FACT, mpb.MEMORY_KIND_PREFERENCE, mpb.MEMORY_KIND_INSTRUCTION]),
            memory_texts,
        ),
        max_size=6,
    ),
    window=st.integers(1, 4000),
    reserved=st.integers(1, 1500),
    user_input=texts,
    input_is_last_turn=st.booleans(),
    caps=caps,
    strategy=st.sampled_from(STRATEGIES),
    system=texts,
    fallback=st.sampled_from(FALLBACKS),
    window_turns=st.integers(1, 30),
)
def test_headroom_invariant(
    clients: dict[str, memlane.Client],
    *,
    session: tuple[list[Message], int, str],
    memories: list[tuple[mpb.MemoryKind.ValueType, str]],
    window: int,
    reserved: int,
    user_input: str,
    input_is_last_turn: bool,
    caps: cpb.SectionCaps,
    strategy: cpb.ContextStrategy.ValueType,
    system: str,
    fallback: str,
    window_turns: int,
) -> None:
    c = clients[fallback]
    msgs, through, summary_text = session
    if user_input and input_is_last_turn:
        msgs = [*msgs, Message(role=Role.ROLE_USER, content=user_input)]  # the input already stored
    user = f"hr-{uuid.uuid4().hex[:8]}"
    sid = c.create_session(user_id=user).session.session_id
    if msgs:
        stored = c.append_messages(session_id=sid, messages=msgs).results
        assert [m.seq for m in stored] == list(range(1, len(msgs) + 1))
        if through:
            at = stored[through - 1]
            c.submit_summary(
                session_id=sid,
                text=summary_text,
                after_seq=0,
                through_seq=at.seq,
                through_message_id=at.message_id,
            )
    for kind, content in memories:
        c.create_memory(caller=mpb.Caller(user_id=user), kind=kind, content=content)

    request = cpb.AssembleContextRequest(
        session_id=sid,
        user_input=user_input,
        context_window_tokens=window,
        reserved_output_tokens=reserved,
        system_prompt=system,
        caps=caps,
        strategy=strategy,
        window_turns=window_turns,
    )
    input_cost = Costing(COUNTER, "").message(user_input) if user_input else 0
    if reserved + input_cost > window:
        # The reserved output and the input alone do not fit: nothing can be assembled, and it says so.
        event("rejected: the reserved output and the input exceed the window")
        with pytest.raises(memlane.InvalidArgumentError, match="exceed the context window"):
            list(c.assemble_context(request))
    else:
        event("assembled")
        check_assembly(
            c.assemble_context(request),
            turns=len(msgs),
            request=request,
            input_cost=input_cost,
            input_is_last_turn=input_is_last_turn,
        )


def check_assembly(
    responses: Iterable[cpb.AssembleContextResponse],
    *,
    turns: int,
    request: cpb.AssembleContextRequest,
    input_cost: int,
    input_is_last_turn: bool,
) -> None:
    window, reserved = request.context_window_tokens, request.reserved_output_tokens
    caps, strategy = request.caps, request.strategy
    blocks: list[cpb.ContextBlock] = []
    stats: cpb.AssembleStats | None = None
    for item in responses:
        assert stats is None, "a response after the stats"
        blocks.extend(item.blocks)
        if item.HasField("stats"):
            stats = item.stats
    assert stats is not None
    costing = Costing(COUNTER, stats.model)
    assert stats.context_window_tokens == window and stats.reserved_output_tokens == reserved
    # The input is charged once: as extra input, or as the stored last turn it already is.
    assert stats.input_tokens in ({0, input_cost} if input_is_last_turn else {input_cost})

    # The invariant.
    assert [b.provenance for b in blocks] == [1, 2, 3, 4, 5]
    assert sum(b.token_count for b in blocks) == stats.total_tokens
    assert stats.total_tokens + stats.input_tokens + reserved <= window
    assert stats.headroom_tokens == window - reserved - stats.input_tokens - stats.total_tokens
    for b in blocks:
        # Token counts are exact, not estimates: recount what the block holds.
        assert b.token_count == sum(costing.message(m.content, m.name) for m in b.messages)
        assert b.token_count <= b.cap_tokens or b.provenance == cpb.PROVENANCE_CONVERSATION
    system_block, profile_block, memory_block, summary_block, conversation = blocks
    # Caps hold per section.
    if caps.system_tokens:
        assert system_block.token_count <= caps.system_tokens
    if caps.profile_tokens:
        assert profile_block.token_count <= caps.profile_tokens
    if caps.memory_tokens:
        assert memory_block.token_count <= caps.memory_tokens
    if caps.history_tokens:
        assert summary_block.token_count + conversation.token_count <= caps.history_tokens
    # The conversation is a contiguous run of the newest turns, in order.
    kept = [m.seq for m in conversation.messages]
    if kept:
        assert kept == list(range(kept[0], kept[-1] + 1))
        if strategy != cpb.CONTEXT_STRATEGY_SLIDING_WINDOW:
            assert kept[-1] == turns


def test_a_roomy_budget_fills_every_section(clients: dict[str, memlane.Client]) -> None:
    """Positive control for the property: its sessions and memories do reach every block."""
    c = clients[FALLBACKS[0]]
    user = f"hr-{uuid.uuid4().hex[:8]}"
    sid = c.create_session(user_id=user).session.session_id
    turns = [Message(role=Role.ROLE_USER, content="we decided the plan") for _ in range(4)]
    c.append_messages(session_id=sid, messages=turns)
    first = c.list_messages(session_id=sid).messages[1]
    c.submit_summary(
        session_id=sid, text="we must plan", after_seq=0, through_seq=2, through_message_id=first.message_id
    )
    for kind in (mpb.MEMORY_KIND_FACT, mpb.MEMORY_KIND_PREFERENCE):
        c.create_memory(
            caller=mpb.Caller(user_id=user), kind=kind, content="User notes: order ORD-1234 plan."
        )
    # Recalled but not in the profile (which the memory block does not repeat): an episode.
    c.create_memory(
        caller=mpb.Caller(user_id=user),
        kind=mpb.MEMORY_KIND_EPISODIC,
        content="User: the plan for order ORD-1234 was agreed on the call.",
    )
    blocks = [
        b
        for item in c.assemble_context(
            session_id=sid,
            user_input="order ORD-1234 plan",
            context_window_tokens=4000,
            reserved_output_tokens=100,
            system_prompt="hello",
            strategy=cpb.CONTEXT_STRATEGY_HYBRID,
        )
        for b in item.blocks
    ]
    assert [b.provenance for b in blocks] == [1, 2, 3, 4, 5]
    assert all(b.messages and b.token_count > 0 for b in blocks), blocks
