"""Procedural memory through the real server: the life of a procedure (propose, approve, reject, roll
back), what reaches an assembled context (only active versions, only the agent's own and its groups',
within the cap), approval modes, the extractor, and export/erasure of versions learned from a user."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

import memlane
from memlane import Message, Role
from memlane.v1 import context_pb2 as cpb
from memlane.v1 import procedure_pb2 as ppb
from memlane_server.background import SidecarThread
from memlane_server.cli import main
from tests.conftest import ServerFactory
from tests.integration.test_user_data import _redis_bytes

AGENTS = ("helper", "writer", "outsider", "member", "ops", "auditor")
TOKENS = {a: f"tok-{a}-{uuid.uuid4().hex[:6]}" for a in AGENTS}
ROUTINE = ppb.PROCEDURE_KIND_ROUTINE
PROPOSED, ACTIVE = ppb.PROCEDURE_STATE_PROPOSED, ppb.PROCEDURE_STATE_ACTIVE


def _policy() -> dict[str, object]:
    return {
        "tokens": [{"sha256": hashlib.sha256(TOKENS[a].encode()).hexdigest(), "agent": a} for a in AGENTS],
        "agents": {
            "writer": {"procedure_approval": "auto"},
            "ops": {"roles": ["admin"]},
            "auditor": {"roles": ["auditor"]},
        },
        "groups": {"support": ["helper", "member"]},
    }


@pytest.fixture(scope="module")
def secured(start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> SidecarThread:
    path: Path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(yaml.safe_dump(_policy()))
    return start_server(auth_required=True, access_policy_file=str(path), context_procedures_max_tokens=300)


@pytest.fixture(scope="module")
def clients(secured: SidecarThread) -> Iterator[dict[str, memlane.Client]]:
    out = {a: memlane.Client(secured.target, token=TOKENS[a], timeout=20) for a in AGENTS}
    yield out
    for c in out.values():
        c.close()


def _session(c: memlane.Client, agent: str, user: str) -> str:
    sid = f"s-{agent}-{uuid.uuid4().hex[:8]}"
    c.create_session(session_id=sid, user_id=user, agent_id=agent)
    c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="hello there")])
    return sid


def _procedure_blocks(c: memlane.Client, sid: str, **options: Any) -> list[cpb.ContextBlock]:
    blocks = [
        b for r in c.assemble_context(session_id=sid, user_input="next step", **options) for b in r.blocks
    ]
    assert blocks[0].provenance == cpb.PROVENANCE_SYSTEM
    return [b for b in blocks if b.provenance == cpb.PROVENANCE_PROCEDURE]


def _injected(c: memlane.Client, sid: str, only: str = "", **options: Any) -> list[tuple[str, str, str, int]]:
    """The procedures injected (``only``: of this procedure id; other tests of the module add theirs)."""
    return [
        (r.agent_id, r.group, r.procedure_id, r.version)
        for b in _procedure_blocks(c, sid, **options)
        for r in b.procedures
        if not only or r.procedure_id == only
    ]


def _text(c: memlane.Client, sid: str) -> str:
    return "\n".join(m.content for b in _procedure_blocks(c, sid) for m in b.messages)


def _propose(c: memlane.Client, pid: str, content: str, **fields: Any) -> ppb.ProposeProcedureResponse:
    return c.propose_procedure(procedure_id=pid, kind=ROUTINE, content=content, title=pid, **fields)


def test_life_of_a_procedure(clients: dict[str, memlane.Client], user_id: str) -> None:
    helper, ops = clients["helper"], clients["ops"]
    sid = _session(helper, "helper", user_id)
    pid = f"refunds-{uuid.uuid4().hex[:6]}"
    owner = ppb.ProcedureOwner(agent_id="helper")

    first = _propose(helper, pid, "Check the order number before promising a refund.", reason="learned")
    assert (first.version, first.created) == (1, True)
    assert first.procedure.versions[0].state == PROPOSED
    assert first.procedure.versions[0].origin == ppb.PROCEDURE_ORIGIN_AGENT
    assert _injected(helper, sid, only=pid) == []  # proposed: never injected
    again = _propose(helper, pid, "Check the order number before promising a refund.")
    assert (again.version, again.created) == (1, False)  # a retry adds nothing

    with pytest.raises(memlane.PermissionDeniedError):  # human in the loop: the agent cannot approve
        helper.approve_procedure(owner=owner, procedure_id=pid, version=1)
    approved = ops.approve_procedure(owner=owner, procedure_id=pid, version=1, note="looks right")
    assert approved.procedure.active_version == 1
    assert _injected(helper, sid, only=pid) == [("helper", "", pid, 1)]
    assert "Check the order number" in _text(helper, sid)

    _propose(helper, pid, "Promise refunds freely.")
    assert _injected(helper, sid, only=pid) == [
        ("helper", "", pid, 1)
    ]  # v2 proposed: v1 still the one injected
    rejected = ops.reject_procedure(owner=owner, procedure_id=pid, version=2, note="no")
    assert rejected.procedure.versions[1].state == ppb.PROCEDURE_STATE_REJECTED
    with pytest.raises(memlane.FailedPreconditionError):
        ops.approve_procedure(owner=owner, procedure_id=pid, version=2)
    assert "freely" not in _text(helper, sid)

    _propose(helper, pid, "Check the order number and the delivery date before a refund.")
    third = ops.approve_procedure(owner=owner, procedure_id=pid, version=3)
    states = [v.state for v in third.procedure.versions]
    assert states == [ppb.PROCEDURE_STATE_SUPERSEDED, ppb.PROCEDURE_STATE_REJECTED, ACTIVE]
    assert _injected(helper, sid, only=pid) == [("helper", "", pid, 3)]

    back = ops.roll_back_procedure(owner=owner, procedure_id=pid, note="v3 confused customers")
    assert back.procedure.active_version == 1
    assert back.procedure.versions[2].state == ppb.PROCEDURE_STATE_ROLLED_BACK
    assert _injected(helper, sid, only=pid) == [("helper", "", pid, 1)]
    assert "delivery date" not in _text(helper, sid)

    back = ops.roll_back_procedure(owner=owner, procedure_id=pid)
    assert back.procedure.active_version == 0  # nothing earlier was approved: nothing injected
    assert _injected(helper, sid, only=pid) == []
    with pytest.raises(memlane.FailedPreconditionError):
        ops.roll_back_procedure(owner=owner, procedure_id=pid)
    [listed] = [p for p in helper.list_procedures(owner=owner).procedures if p.procedure_id == pid]
    assert len(listed.versions) == 3


def test_auto_approval_and_extracted_versions_wait(clients: dict[str, memlane.Client], user_id: str) -> None:
    writer = clients["writer"]
    sid = _session(writer, "writer", user_id)
    pid = f"tone-{uuid.uuid4().hex[:6]}"
    out = _propose(writer, pid, "Write short paragraphs.")
    assert out.procedure.active_version == 1  # writer is `auto` in the access policy
    assert _injected(writer, sid, only=pid) == [("writer", "", pid, 1)]
    with pytest.raises(memlane.PermissionDeniedError):  # auto approval is not the right to approve
        writer.reject_procedure(owner=ppb.ProcedureOwner(agent_id="writer"), procedure_id=pid, version=1)


def test_nobody_elses_procedure_reaches_a_context(clients: dict[str, memlane.Client], user_id: str) -> None:
    helper, outsider, ops = clients["helper"], clients["outsider"], clients["ops"]
    mine, shared = f"own-{uuid.uuid4().hex[:6]}", f"grp-{uuid.uuid4().hex[:6]}"
    _propose(helper, mine, "Helper's own routine.")
    _propose(helper, shared, "Support group routine.", owner=ppb.ProcedureOwner(group="support"))
    ops.approve_procedure(owner=ppb.ProcedureOwner(agent_id="helper"), procedure_id=mine, version=1)
    ops.approve_procedure(owner=ppb.ProcedureOwner(group="support"), procedure_id=shared, version=1)

    got = {agent: _injected(clients[agent], _session(clients[agent], agent, user_id)) for agent in AGENTS[:4]}
    assert ("helper", "", mine, 1) in got["helper"] and ("", "support", shared, 1) in got["helper"]
    assert ("", "support", shared, 1) in got["member"]  # a group member gets the group's
    assert all(r[2] != mine for r in got["member"])  # ...never another agent's own
    assert all(r[2] not in (mine, shared) for agent in ("writer", "outsider") for r in got[agent])

    with pytest.raises(memlane.PermissionDeniedError):
        outsider.get_procedure(owner=ppb.ProcedureOwner(agent_id="helper"), procedure_id=mine)
    with pytest.raises(memlane.PermissionDeniedError):
        outsider.propose_procedure(
            owner=ppb.ProcedureOwner(agent_id="helper"), procedure_id="x", kind=ROUTINE, content="evil"
        )
    with pytest.raises(memlane.PermissionDeniedError):
        outsider.propose_procedure(
            owner=ppb.ProcedureOwner(group="support"), procedure_id="x", kind=ROUTINE, content="evil"
        )
    assert all(p.procedure_id not in (mine, shared) for p in outsider.list_procedures().procedures)
    assert {mine, shared} <= {p.procedure_id for p in clients["auditor"].list_procedures().procedures}
    with pytest.raises(memlane.PermissionDeniedError):
        clients["auditor"].propose_procedure(procedure_id="x", kind=ROUTINE, content="audit")


def test_procedures_stay_within_their_cap(clients: dict[str, memlane.Client], user_id: str) -> None:
    writer = clients["writer"]  # auto: proposals are active at once
    sid = _session(writer, "writer", user_id)
    short, long = f"a-short-{uuid.uuid4().hex[:6]}", f"b-long-{uuid.uuid4().hex[:6]}"
    _propose(writer, short, "Greet the user by name.")
    _propose(writer, long, "Explain every step in detail. " * 60)  # ~360 tokens: over the cap of 300
    [block] = _procedure_blocks(writer, sid)
    ids = [r.procedure_id for r in block.procedures]
    assert short in ids and long not in ids  # positive control: the short one fits
    assert block.truncated and block.token_count <= block.cap_tokens <= 300
    # The system section's cap is shared with the system prompt: a prompt that fills it leaves none.
    prompt = "Be helpful. " * 40
    blocks = _procedure_blocks(writer, sid, system_prompt=prompt, caps=cpb.SectionCaps(system_tokens=90))
    assert all(not b.procedures for b in blocks)


def test_extractor_proposes_from_a_successful_session(
    start_server: ServerFactory, redis_url: str, user_id: str
) -> None:
    dev = start_server(procedure_approval="auto")
    with memlane.Client(dev.target, timeout=30) as c:  # local, no agent header: an operator
        sid = f"win-{uuid.uuid4().hex[:8]}"
        c.create_session(
            session_id=sid, user_id=user_id, agent_id="bot", metadata={"memlane.outcome": "success"}
        )
        c.append_messages(
            session_id=sid,
            messages=[
                Message(role=Role.ROLE_USER, content="How do I reset the router in the blue box?"),
                Message(role=Role.ROLE_ASSISTANT, content="Hold the red button for ten seconds, then wait."),
            ],
        )
        c.promote_session(session_id=sid, close=True)
        [proc] = [p for p in c.list_procedures(owner=ppb.ProcedureOwner(agent_id="bot")).procedures]
        [version] = proc.versions
        assert version.origin == ppb.PROCEDURE_ORIGIN_EXTRACTOR and version.kind == ppb.PROCEDURE_KIND_EXAMPLE
        assert version.state == PROPOSED  # auto approval never applies to extracted versions
        assert "red button" in version.content and version.source_session_id == sid

        other = f"next-{uuid.uuid4().hex[:8]}"
        c.create_session(session_id=other, user_id=user_id, agent_id="bot")
        assert _injected(c, other) == []

        exported = b"".join(part.data for part in c.export_user_data(user_id=user_id))
        records = [orjson.loads(line) for line in exported.splitlines()]
        assert any("red button" in r.get("content", "") for r in records if "procedure_id" in r)

        # Approved, it reaches another user's context; that user's trace keeps it by reference only.
        c.approve_procedure(
            owner=ppb.ProcedureOwner(agent_id="bot"), procedure_id=proc.procedure_id, version=1
        )
        elsewhere = f"else-{uuid.uuid4().hex[:8]}"
        c.create_session(session_id=elsewhere, user_id=f"{user_id}-other", agent_id="bot")
        responses = list(c.assemble_context(session_id=elsewhere, user_input="my router is stuck"))
        blocks = [b for r in responses for b in r.blocks if b.provenance == cpb.PROVENANCE_PROCEDURE]
        assert "red button" in blocks[0].messages[0].content
        trace_id = responses[-1].stats.trace_id
        [kept] = [
            b
            for b in c.get_turn_trace(session_id=elsewhere, trace_id=trace_id).trace.blocks
            if b.provenance == cpb.PROVENANCE_PROCEDURE
        ]
        assert [r.procedure_id for r in kept.procedures] == [proc.procedure_id] and not kept.messages
        assert b"red button" in _redis_bytes(redis_url, dev.settings.redis.key_prefix)  # positive control

        receipt = c.forget_user(user_id=user_id)
        assert receipt.erased["redis.procedure_versions"] == 1
        with pytest.raises(memlane.NotFoundError):
            c.get_procedure(owner=ppb.ProcedureOwner(agent_id="bot"), procedure_id=proc.procedure_id)
        assert _injected(c, elsewhere) == []
        assert b"red button" not in _redis_bytes(redis_url, dev.settings.redis.key_prefix)


def test_operator_cli_reviews_procedures(
    start_server: ServerFactory, user_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dev = start_server()
    target = ["--target", dev.target]
    pid = f"cli-{uuid.uuid4().hex[:6]}"
    assert (
        main(["procedures", "propose", "--agent", "bot", pid, "--content", "Say hello first.", *target]) == 0
    )
    assert json.loads(capsys.readouterr().out)["versions"][0]["state"] == "proposed"
    assert main(["procedures", "list", "--agent", "bot", "--state", "proposed", *target]) == 0
    assert [json.loads(line)["procedure_id"] for line in capsys.readouterr().out.splitlines()] == [pid]
    assert main(["procedures", "approve", "--agent", "bot", pid, "1", "--note", "ok", *target]) == 0
    assert json.loads(capsys.readouterr().out)["active_version"] == 1
    with memlane.Client(dev.target, timeout=20) as c:
        c.create_session(session_id=f"s-{pid}", user_id=user_id, agent_id="bot")
        assert _injected(c, f"s-{pid}") == [("bot", "", pid, 1)]
    assert main(["procedures", "rollback", "--agent", "bot", pid, *target]) == 0
    assert "active_version" not in json.loads(capsys.readouterr().out)  # 0: nothing active
    assert main(["procedures", "reject", "--agent", "bot", pid, "1", *target]) == 1  # not proposed
