"""AssembleContext through the real client, server and Redis: strategies, budgets, summaries, traces."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

import memlane
from memlane import Message, Role
from memlane.v1 import context_pb2 as cpb
from memlane.v1 import memory_pb2 as mpb
from memlane_server.access.identity import Caller
from memlane_server.background import SidecarThread
from memlane_server.config import build_settings
from memlane_server.context import MemoryHit
from tests.conftest import ServerFactory, delete_prefix, wait_for
from tests.peers.openai_compat import LoggedRequest, OpenAICompatServer
from tests.synthetic_sessions import EARLY_ID, session_texts

DECISION = "We decided to go with the annual plan and the blue colour."
ORDER = "My order number is ORD-77123, please keep it handy."
FILLER = [
    "sounds good",
    "that makes sense",
    "tell me more",
    "nice weather here",
    "interesting point",
    "let me think about it",
    "alright then",
    "good to know",
    "fair enough",
    "I see",
]


def _turns(start: int, end: int) -> list[Message]:
    """Turns start..end (1-based): turn 2 carries a decision, turn 5 an order number, the rest filler."""
    out = []
    for i in range(start, end + 1):
        text = {2: DECISION, 5: ORDER}.get(i, f"{FILLER[i % len(FILLER)]}, {FILLER[(i * 7) % len(FILLER)]}.")
        out.append(Message(role=Role.ROLE_USER if i % 2 else Role.ROLE_ASSISTANT, content=text))
    return out


def _session(client: memlane.Client, n: int, **kw: Any) -> str:
    sid = client.create_session(user_id=f"u-{uuid.uuid4().hex[:8]}", **kw).session.session_id
    for lo in range(1, n + 1, 100):
        client.append_messages(session_id=sid, messages=_turns(lo, min(n, lo + 99)))
    return sid


def assemble(client: memlane.Client, **fields: Any) -> tuple[list[cpb.ContextBlock], cpb.AssembleStats]:
    blocks: list[cpb.ContextBlock] = []
    stats: cpb.AssembleStats | None = None
    for item in client.assemble_context(**fields):
        assert stats is None, "a response after the stats"
        blocks.extend(item.blocks)
        if item.HasField("stats"):
            stats = item.stats
    assert stats is not None
    # The headroom invariant and exact totals, on every assembly in these tests.
    assert sum(b.token_count for b in blocks) == stats.total_tokens
    assert (
        stats.total_tokens + stats.input_tokens + stats.reserved_output_tokens <= stats.context_window_tokens
    )
    assert [b.provenance for b in blocks] == [1, 2, 3, 4, 5]
    return blocks, stats


def _text(blocks: list[cpb.ContextBlock]) -> str:
    return "\n".join(m.content for b in blocks for m in b.messages)


def _wait_summary(client: memlane.Client, sid: str, beyond: int, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = client.get_session(session_id=sid).session.summary
        if s.through_seq > beyond:
            return s
        time.sleep(0.02)
    raise AssertionError(f"summary did not move beyond {beyond}")


@pytest.fixture(scope="module")
def client(start_server: ServerFactory) -> Iterator[memlane.Client]:
    with memlane.Client(start_server().target, timeout=10) as c:
        yield c


WINDOW = dict(context_window_tokens=1500, reserved_output_tokens=300)


@pytest.mark.parametrize(
    "strategy",
    [
        cpb.CONTEXT_STRATEGY_FULL_BUFFER,
        cpb.CONTEXT_STRATEGY_SLIDING_WINDOW,
        cpb.CONTEXT_STRATEGY_ROLLING_SUMMARY,
        cpb.CONTEXT_STRATEGY_HYBRID,
    ],
)
def test_each_strategy_on_a_300_turn_session(client: memlane.Client, strategy: int) -> None:
    sid = _session(client, 300)
    blocks, stats = assemble(
        client,
        session_id=sid,
        strategy=strategy,
        user_input="what next?",
        window_turns=10,
        system_prompt="You are helpful.",
        **WINDOW,
    )
    conv = blocks[4]
    assert stats.strategy == strategy
    assert conv.messages[-1].seq == 300 and conv.message_ids[-1] == conv.messages[-1].message_id
    seqs = [m.seq for m in conv.messages]
    assert seqs == list(range(seqs[0], 301))  # the newest turns, contiguous, in order
    assert blocks[0].messages[0].content == "You are helpful."
    if strategy == cpb.CONTEXT_STRATEGY_SLIDING_WINDOW:
        assert len(conv.messages) == 10 and not blocks[3].messages
    elif strategy == cpb.CONTEXT_STRATEGY_FULL_BUFFER:
        assert stats.fallback == cpb.HISTORY_FALLBACK_DROPPED_OLDEST and stats.dropped_message_count > 0
        assert stats.dropped_message_count + len(conv.messages) == 300
    else:
        # No summary yet and 300 turns over budget: the gap is summarized first (resumption) and persisted.
        assert stats.fallback == cpb.HISTORY_FALLBACK_GAP_SUMMARY
        assert blocks[3].messages and "ORD-77123" in blocks[3].messages[0].content
        assert client.get_session(session_id=sid).session.summary.through_seq > 0


def test_decision_and_order_number_reach_turn_300_with_hybrid_not_with_sliding_window(
    client: memlane.Client,
) -> None:
    sid = client.create_session(user_id="u-long").session.session_id
    through = 0
    for lo in range(1, 301, 25):  # a conversation: 25 turns, then a model call, twelve times
        client.append_messages(session_id=sid, messages=_turns(lo, lo + 24))
        _, stats = assemble(client, session_id=sid, user_input="ok", **WINDOW)
        assert stats.fallback in (cpb.HISTORY_FALLBACK_NONE, cpb.HISTORY_FALLBACK_GAP_SUMMARY)
        if stats.summarization_scheduled:
            through = _wait_summary(client, sid, through).through_seq
    hybrid, _ = assemble(client, session_id=sid, user_input="remind me", **WINDOW)
    assert DECISION in _text(hybrid) and "ORD-77123" in _text(hybrid)
    assert hybrid[4].messages[0].seq > 5  # they came through the summary, not as turns
    sliding, _ = assemble(
        client, session_id=sid, user_input="remind me", strategy=cpb.CONTEXT_STRATEGY_SLIDING_WINDOW, **WINDOW
    )
    assert "annual plan" not in _text(sliding) and "ORD-77123" not in _text(sliding)


def test_a_sessions_own_learnt_turns_stay_out_of_its_recall_and_reach_its_next_session(
    client: memlane.Client,
) -> None:
    """Learning during the session makes its turns episodes; recalled into the same session they would
    bring back what its strategy left out (a sliding window's old turns) as "earlier conversations".
    Its history is the authority for its own turns; the next session of the user recalls them."""
    user = f"u-{uuid.uuid4().hex[:8]}"
    sid = client.create_session(user_id=user).session.session_id
    client.append_messages(session_id=sid, messages=_turns(1, 30))

    def learnt() -> list[mpb.Memory] | None:
        hits = client.search_memories(caller=mpb.Caller(user_id=user), query=DECISION, limit=50).results
        own = [
            h.memory for h in hits if h.memory.source_session_id == sid and "annual plan" in h.memory.content
        ]
        return [m for m in own if m.kind == mpb.MEMORY_KIND_EPISODIC] or None

    wait_for(learnt, timeout=30)
    question = "which plan did we decide on?"
    sliding, _ = assemble(
        client,
        session_id=sid,
        user_input=question,
        strategy=cpb.CONTEXT_STRATEGY_SLIDING_WINDOW,
        window_turns=4,
        **WINDOW,
    )
    assert [m.seq for m in sliding[4].messages] == [27, 28, 29, 30]
    assert "annual plan" not in _text(sliding)
    # Positive control: the user's next session recalls the decision from this one.
    following = client.create_session(user_id=user).session.session_id
    recalled, _ = assemble(client, session_id=following, user_input=question, **WINDOW)
    assert "annual plan" in "\n".join(m.content for m in recalled[2].messages)


@pytest.mark.parametrize("shape", ["routine_numbers", "status_templates", "many_identifiers"])
def test_an_identifier_stated_early_survives_a_long_session_of_filler(
    client: memlane.Client, shape: str
) -> None:
    sid = client.create_session(user_id=f"u-{shape}").session.session_id
    texts = session_texts(shape, seed=11, n=300)
    through = 0
    for lo in range(0, 300, 25):  # an agent loop: 25 turns, then a model call
        batch = [
            Message(role=Role.ROLE_USER if seq % 2 else Role.ROLE_ASSISTANT, content=text)
            for seq, text in texts[lo : lo + 25]
        ]
        client.append_messages(session_id=sid, messages=batch)
        _, stats = assemble(client, session_id=sid, **WINDOW)
        if stats.summarization_scheduled:
            through = _wait_summary(client, sid, through).through_seq
    blocks, stats = assemble(client, session_id=sid, user_input="what is my purchase order?", **WINDOW)
    summary = blocks[3].messages[0].content
    assert blocks[4].messages[0].seq > 3 and stats.dropped_message_count == 0  # it left the recent turns
    assert EARLY_ID in summary  # ...and stayed in the summary
    # Positive control: the summary is full of the session's filler too, not just the identifier.
    assert len(summary.splitlines()) > 5


def test_summarization_triggers_at_75_percent_of_the_history_budget(client: memlane.Client) -> None:
    sid = client.create_session(user_id="u-trigger").session.session_id
    window = dict(context_window_tokens=1000, reserved_output_tokens=200, system_prompt="")
    history_budget = 800  # no system prompt, no input, no LTM: history gets all that is available
    # Each turn costs its content tokens + 4; add turns until just under 75%.
    scheduled_at = None
    for _ in range(1, 200):
        client.append_messages(
            session_id=sid, messages=[Message(role=Role.ROLE_USER, content="alpha beta gamma")]
        )
        blocks, stats = assemble(client, session_id=sid, **window)
        used = blocks[4].token_count
        if stats.summarization_scheduled:
            scheduled_at = used
            break
        assert used < 0.75 * history_budget
    assert scheduled_at is not None and 0.75 * history_budget <= scheduled_at < history_budget
    assert stats.fallback == cpb.HISTORY_FALLBACK_NONE  # triggered before the hard limit, nothing lost
    summary = _wait_summary(client, sid, 0)
    blocks, stats = assemble(client, session_id=sid, **window)
    assert blocks[3].messages and blocks[4].messages[0].seq == summary.through_seq + 1
    assert blocks[4].token_count <= 0.5 * history_budget  # hybrid keeps half the budget verbatim
    assert not stats.summarization_scheduled


def test_traces_replay_the_exact_blocks(client: memlane.Client) -> None:
    sid = _session(client, 40)
    streamed = []
    for i in range(3):
        blocks, stats = assemble(
            client, session_id=sid, user_input=f"q{i}", render_text=True, request_id=f"r{i}", **WINDOW
        )
        streamed.append((blocks, stats))
    for blocks, stats in streamed:
        trace = client.get_turn_trace(session_id=sid, trace_id=stats.trace_id).trace
        assert list(trace.blocks) == blocks
        assert trace.stats == stats
        assert trace.request.session_id == sid
    assert "## Recent conversation" in streamed[0][0][4].rendered_text
    page1 = client.list_turn_traces(session_id=sid, page_size=2)
    page2 = client.list_turn_traces(session_id=sid, page_size=2, page_token=page1.next_page_token)
    ids = [t.trace_id for t in page1.traces] + [t.trace_id for t in page2.traces]
    assert ids == [s.trace_id for _, s in reversed(streamed)] and not page2.next_page_token
    assert [t.request.request_id for t in page1.traces] == ["r2", "r1"]
    with pytest.raises(memlane.NotFoundError):
        client.get_turn_trace(session_id=sid, trace_id="0000000000000-nope")


def test_errors(client: memlane.Client) -> None:
    with pytest.raises(memlane.NotFoundError):
        assemble(client, session_id="no-such-session")
    sid = _session(client, 2)
    with pytest.raises(memlane.InvalidArgumentError):
        assemble(client, session_id=sid, context_window_tokens=100, reserved_output_tokens=101)


# --------------------------------------------------------------------------------- client summaries


def test_client_supplied_summaries_and_stale_rejection(start_server: ServerFactory) -> None:
    with memlane.Client(start_server(summarizer="client").target, timeout=10) as c:
        sid = c.create_session(user_id="u-client").session.session_id
        c.append_messages(session_id=sid, messages=_turns(1, 120))
        window = dict(context_window_tokens=2000, reserved_output_tokens=200)
        _, stats = assemble(c, session_id=sid, **window)
        assert stats.HasField("summary_request") and not stats.summarization_scheduled
        rng = stats.summary_request
        assert rng.after_seq == 0 and rng.through_seq > 0 and rng.budget_tokens > 0
        text = f"The user chose the annual plan. Order ORD-77123. (turns 1-{rng.through_seq})"
        got = c.submit_summary(
            session_id=sid,
            text=text,
            after_seq=0,
            through_seq=rng.through_seq,
            through_message_id=rng.through_message_id,
        ).summary
        assert got.through_seq == rng.through_seq and got.token_count > 0
        # A retry of the same submission is fine.
        c.submit_summary(
            session_id=sid,
            text=text,
            after_seq=0,
            through_seq=rng.through_seq,
            through_message_id=rng.through_message_id,
        )
        blocks, stats = assemble(c, session_id=sid, **window)
        assert text in blocks[3].messages[0].content
        assert blocks[4].messages[0].seq == rng.through_seq + 1
        # Stale: a summary that continues from 0 no longer matches the stored range.
        with pytest.raises(memlane.FailedPreconditionError):
            c.submit_summary(
                session_id=sid,
                text="another",
                after_seq=0,
                through_seq=rng.through_seq + 1,
                through_message_id="x",
            )
        with pytest.raises(memlane.InvalidArgumentError):  # wrong message id for the seq
            c.submit_summary(
                session_id=sid,
                text="next",
                after_seq=rng.through_seq,
                through_seq=rng.through_seq + 1,
                through_message_id="not-that-one",
            )


# ------------------------------------------------------------- incremental, through an OpenAI peer


def test_incremental_summary_reads_only_the_leaving_turns(start_server: ServerFactory) -> None:
    with OpenAICompatServer(api_key="k-test") as llm:
        calls: list[LoggedRequest] = []

        def respond(req: LoggedRequest) -> str:
            calls.append(req)
            return f"SUMMARY-{len(calls)}: decision annual plan; order ORD-77123."

        llm.responder = respond
        srv = start_server(
            summarizer="openai",
            summarizer_base_url=llm.base_url,
            summarizer_model="m-test",
            summarizer_api_key="k-test",
        )
        with memlane.Client(srv.target, timeout=10) as c:
            sid = c.create_session(user_id="u-inc").session.session_id
            window = dict(context_window_tokens=1000, reserved_output_tokens=200, system_prompt="")
            through = 0
            for lo in range(1, 121, 30):
                c.append_messages(session_id=sid, messages=_turns(lo, lo + 29))
                _, stats = assemble(c, session_id=sid, **window)
                if stats.summarization_scheduled:
                    through = _wait_summary(c, sid, through).through_seq
            assert len(calls) >= 2
            first, second = calls[0].body["messages"][1]["content"], calls[1].body["messages"][1]["content"]
            assert calls[0].headers["authorization"] == "Bearer k-test" and calls[0].body["model"] == "m-test"
            # The second call gets the first summary and only turns after the first summary's range.
            assert "SUMMARY-1" in second and "[#1]" in first
            first_last = max(int(t.split("]")[0]) for t in first.split("[#")[1:])
            second_seqs = [int(t.split("]")[0]) for t in second.split("[#")[1:]]
            assert second_seqs and min(second_seqs) > first_last
            blocks, _ = assemble(c, session_id=sid, **window)
            assert (
                blocks[3]
                .messages[0]
                .content.endswith(f"SUMMARY-{len(calls)}: decision annual plan; order ORD-77123.")
            )
        text = srv.sidecar.registry.get_sample_value(
            "memlane_summarization_calls_total", {"provider": "openai", "outcome": "ok"}
        )
        assert text == len(calls)
        assert (
            srv.sidecar.registry.get_sample_value(
                "memlane_summarization_tokens_in_total", {"provider": "openai"}
            )
            or 0
        ) > 0


# ------------------------------------------------------------------------------------- streaming


def test_first_block_arrives_before_a_slow_memory_section_completes(
    start_server: ServerFactory, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    released = threading.Event()

    class SlowRecall:
        def forget(self, user_id: str) -> None:
            return None

        async def profile(self, user_id: str, viewer: Caller, limit_tokens: int) -> list[MemoryHit]:
            return [MemoryHit("p1", "Prefers email.", 1.0)]

        async def recall(
            self,
            user_id: str,
            viewer: Caller,
            query: str,
            limit: int,
            channel: str = "",
            *,
            spares: int = 0,
            session_id: str = "",
        ) -> list[MemoryHit]:
            # Blocks until the client has seen the first block: only a streamed response can release it.
            # (a threading.Event: the client runs on the test's thread, the server on its own loop).
            await asyncio.to_thread(released.wait, 10)
            return [MemoryHit("m1", "Order ORD-1 shipped.", 0.9)]

    prefix = f"t{uuid.uuid4().hex[:10]}"
    settings = build_settings(
        flags={
            "listen": "127.0.0.1:0",
            "admin_listen": "",
            "redis_url": redis_url,
            "key_prefix": prefix,
            "data_dir": str(tmp_path_factory.mktemp("d")),
        },
        env={},
    )
    srv = SidecarThread(settings, memory=SlowRecall()).start()
    try:
        with memlane.Client(srv.target, timeout=10) as c:
            sid = _session(c, 4)
            stream = c.assemble_context(session_id=sid, user_input="where is my order?", system_prompt="Sys.")
            first = next(stream)
            # The system block and the (instant) profile arrive while recall is still blocked.
            assert [b.provenance for b in first.blocks] == [cpb.PROVENANCE_SYSTEM, cpb.PROVENANCE_PROFILE]
            assert first.blocks[1].memories[0].memory_id == "p1" and not released.is_set()
            released.set()
            rest = [b for part in stream for b in part.blocks]
            assert rest[0].provenance == cpb.PROVENANCE_MEMORY and rest[0].memories[0].memory_id == "m1"
    finally:
        released.set()
        srv.stop()
        delete_prefix(redis_url, prefix)
