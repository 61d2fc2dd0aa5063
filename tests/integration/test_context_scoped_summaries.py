"""Distributed and selective sessions keep their history: every viewer's summary holds what it may read
(its own private turns, its groups', its delegates'), never what it may not. Through the real client and
a server with tokens, roles and groups."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import memlane
from memlane import Message, Role, Topology, VisibilityKind
from memlane.v1 import context_pb2 as cpb
from tests.conftest import ServerFactory

AGENTS = ("alpha", "beta", "gamma", "boss")
TOKENS = {a: f"tok-{a}-{uuid.uuid4().hex[:6]}" for a in AGENTS}
POLICY = {
    "tokens": [{"sha256": hashlib.sha256(TOKENS[a].encode()).hexdigest(), "agent": a} for a in AGENTS],
    "agents": {"boss": {"roles": ["orchestrator"], "delegates": ["alpha"]}},
    "groups": {"ops": ["alpha", "gamma"]},
}
WINDOW: dict[str, Any] = dict(context_window_tokens=1000, reserved_output_tokens=200, system_prompt="")
ALPHA_ID = "My purchase order is PO-77341-ZX."
BETA_ID = "The beta vault code is BX-4410."
FILLER = ("sounds good", "that makes sense", "tell me more", "nice weather here", "fair enough", "I see")


@pytest.fixture(scope="module")
def clients(
    start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, memlane.Client]]:
    path: Path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(yaml.safe_dump(POLICY))
    srv = start_server(auth_required=True, access_policy_file=str(path), ltm_enabled=False)
    out = {a: memlane.Client(srv.target, token=TOKENS[a], timeout=20) for a in AGENTS}
    yield out
    for c in out.values():
        c.close()


def _turn(i: int, who: str) -> Message:
    text = f"{who} turn {i}: {FILLER[i % len(FILLER)]}, {FILLER[(i * 5) % len(FILLER)]}."
    return Message(role=Role.ROLE_USER if i % 2 else Role.ROLE_ASSISTANT, content=text)


def _assemble(
    c: memlane.Client, sid: str, window: dict[str, Any] = WINDOW
) -> tuple[list[cpb.ContextBlock], cpb.AssembleStats]:
    blocks: list[cpb.ContextBlock] = []
    stats = None
    for part in c.assemble_context(session_id=sid, **window):
        blocks.extend(part.blocks)
        if part.HasField("stats"):
            stats = part.stats
    assert stats is not None
    return blocks, stats


def _summary(blocks: list[cpb.ContextBlock]) -> str:
    return "\n".join(m.content for m in blocks[3].messages)


def _everything(blocks: list[cpb.ContextBlock]) -> str:
    return "\n".join(m.content for b in blocks for m in b.messages)


def _converse(clients: dict[str, memlane.Client], sid: str, n: int) -> None:
    """alpha writes ``n`` turns (turn 3 an identifier) and assembles every 10, as an agent loop would;
    beta adds two turns of its own early on. Waits for each background summarization it triggers."""
    alpha = clients["alpha"]
    for lo in range(1, n + 1, 10):
        batch = [_turn(i, "alpha") for i in range(lo, lo + 10)]
        if lo == 1:
            batch[2] = Message(role=Role.ROLE_USER, content=ALPHA_ID)
        alpha.append_messages(session_id=sid, messages=batch)  # the topology's default visibility
        if lo == 1:
            beta_turns = [Message(role=Role.ROLE_ASSISTANT, content=BETA_ID), _turn(99, "beta")]
            for m in beta_turns:
                m.visibility = VisibilityKind.VISIBILITY_KIND_AGENT
            clients["beta"].append_messages(session_id=sid, messages=beta_turns)
        _, stats = _assemble(alpha, sid)
        if stats.summarization_scheduled:
            _wait_summary_moved(alpha, sid, stats.summary_through_seq)


def _wait_summary_moved(c: memlane.Client, sid: str, beyond: int) -> None:
    deadline = time.monotonic() + 30
    while c.get_session(session_id=sid).session.summary.through_seq <= beyond:
        assert time.monotonic() < deadline, "the scheduled summary never landed"
        time.sleep(0.05)


def test_distributed_each_agent_keeps_its_private_history(clients: dict[str, memlane.Client]) -> None:
    alpha = clients["alpha"]
    sid = alpha.create_session(user_id="u-dist", topology=Topology.TOPOLOGY_DISTRIBUTED).session.session_id
    _converse(clients, sid, 80)
    through = alpha.get_session(session_id=sid).session.summary.through_seq
    assert through > 10  # older turns have left the verbatim window

    blocks, stats = _assemble(alpha, sid)
    assert blocks[4].messages[0].seq > 3  # the identifier is not among the recent turns...
    assert "PO-77341-ZX" in _summary(blocks)  # ...but alpha's summary holds it
    assert stats.fallback == cpb.HISTORY_FALLBACK_NONE and stats.dropped_message_count == 0
    assert "BX-4410" not in _everything(blocks)  # beta's private turn never reaches alpha

    beta, _ = _assemble(clients["beta"], sid)
    assert "BX-4410" in _summary(beta)  # positive control: beta's own private turn, summarized
    assert "PO-77341-ZX" not in _everything(beta) and "alpha turn" not in _everything(beta)

    boss, _ = _assemble(clients["boss"], sid)  # an orchestrator reads for its delegate alpha only
    assert "PO-77341-ZX" in _summary(boss) and "BX-4410" not in _everything(boss)

    gamma, _ = _assemble(clients["gamma"], sid)
    assert "PO-77341-ZX" not in _everything(gamma) and "BX-4410" not in _everything(gamma)
    # The session-wide summary (what GetSession shows everyone) holds no private turn.
    shared = alpha.get_session(session_id=sid).session.summary.text
    assert "PO-77341-ZX" not in shared and "BX-4410" not in shared


def test_selective_group_turns_reach_the_group_and_only_the_group(clients: dict[str, memlane.Client]) -> None:
    alpha = clients["alpha"]
    sid = alpha.create_session(
        user_id="u-sel", topology=Topology.TOPOLOGY_SELECTIVE, group="ops"
    ).session.session_id
    _converse(clients, sid, 80)
    assert alpha.get_session(session_id=sid).session.summary.through_seq > 10

    for member in ("alpha", "gamma", "boss"):  # boss: not in ops, but alpha is its delegate
        blocks, stats = _assemble(clients[member], sid)
        assert "PO-77341-ZX" in _summary(blocks), member
        assert stats.dropped_message_count == 0
    beta, _ = _assemble(clients["beta"], sid)
    assert "BX-4410" in _summary(beta)  # positive control: beta's own private turn
    assert "PO-77341-ZX" not in _everything(beta) and "alpha turn" not in _everything(beta)


def test_a_client_summary_keeps_each_agents_private_turns_apart(start_server: ServerFactory) -> None:
    srv = start_server(summarizer="client", ltm_enabled=False)
    with (
        memlane.Client(srv.target, agent_id="alpha", timeout=20) as alpha,
        memlane.Client(srv.target, agent_id="beta", timeout=20) as beta,
    ):
        sid = alpha.create_session(
            user_id="u-client", topology=Topology.TOPOLOGY_DISTRIBUTED
        ).session.session_id
        turns = [_turn(i, "alpha") for i in range(1, 81)]
        turns[2] = Message(role=Role.ROLE_USER, content=ALPHA_ID)
        alpha.append_messages(session_id=sid, messages=turns)
        # A window the turns fit in, past the trigger ratio: a summary is asked for, not folded in.
        blocks, _ = _assemble(alpha, sid, {**WINDOW, "context_window_tokens": 100_000})
        history = blocks[4].token_count  # all 80 turns
        big = {**WINDOW, "context_window_tokens": 200 + int(history / 0.85)}
        _, stats = _assemble(alpha, sid, big)
        rng = stats.summary_request
        assert rng.after_seq == 0 and rng.through_seq > 3
        # The agent summarizes the session-wide turns with its own model (there are none here).
        alpha.submit_summary(
            session_id=sid,
            text="Nothing shared yet.",
            after_seq=0,
            through_seq=rng.through_seq,
            through_message_id=rng.through_message_id,
        )
        blocks, stats = _assemble(alpha, sid, big)
        assert blocks[4].messages[0].seq > 3 and stats.dropped_message_count == 0
        assert "Nothing shared yet." in _summary(blocks) and "PO-77341-ZX" in _summary(blocks)
        others, _ = _assemble(beta, sid, big)
        assert "Nothing shared yet." in _summary(others)  # positive control: beta reads the shared part
        assert "PO-77341-ZX" not in _everything(others)


def test_a_sliding_window_holds_the_viewers_own_last_turns(start_server: ServerFactory) -> None:
    srv = start_server(ltm_enabled=False)
    with (
        memlane.Client(srv.target, agent_id="alpha", timeout=20) as alpha,
        memlane.Client(srv.target, agent_id="beta", timeout=20) as beta,
    ):
        sid = alpha.create_session(
            user_id="u-window", topology=Topology.TOPOLOGY_DISTRIBUTED
        ).session.session_id
        alpha.append_messages(session_id=sid, messages=[_turn(i, "alpha") for i in range(1, 11)])
        beta.append_messages(session_id=sid, messages=[_turn(i, "beta") for i in range(11, 61)])
        window = {**WINDOW, "strategy": cpb.CONTEXT_STRATEGY_SLIDING_WINDOW, "window_turns": 5}
        blocks, _ = _assemble(alpha, sid, window)
        assert [m.seq for m in blocks[4].messages] == [6, 7, 8, 9, 10]  # alpha's own last five
        blocks, _ = _assemble(beta, sid, window)
        assert [m.seq for m in blocks[4].messages] == [56, 57, 58, 59, 60]  # positive control


def test_removing_a_private_turn_removes_it_from_the_scoped_summary(
    clients: dict[str, memlane.Client],
) -> None:
    alpha, beta = clients["alpha"], clients["beta"]
    sid = alpha.create_session(user_id="u-rm", topology=Topology.TOPOLOGY_DISTRIBUTED).session.session_id
    _converse(clients, sid, 80)
    before, _ = _assemble(beta, sid)
    assert "BX-4410" in _summary(before)  # positive control: beta's private turn is summarized
    own = beta.list_messages(session_id=sid, page_size=1000).messages
    doomed = [m.message_id for m in own if m.content == BETA_ID]
    assert len(doomed) == 1
    assert beta.remove_messages(session_id=sid, message_ids=doomed).removed_count == 1

    after, _ = _assemble(beta, sid)
    assert "beta turn 99" in _everything(after)  # positive control: beta's other turn is still shown
    assert "BX-4410" not in _everything(after)  # the removed turn is gone from the summary too
    assert "PO-77341-ZX" in _everything(_assemble(alpha, sid)[0])  # alpha's turns are untouched
