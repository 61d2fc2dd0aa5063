"""Caller identity and access control through the real server: tokens, roles, groups, topologies,
policy reload. A prompt can never carry memory its agent may not see."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memlane
from memlane import Message, Role, Topology, VisibilityKind
from memlane.v1 import context_pb2 as cpb
from memlane_server.access.authenticate import is_local_peer
from memlane_server.background import SidecarThread
from tests.conftest import ServerFactory, wait_for

AGENTS = ("planner", "researcher", "writer", "outsider", "auditor")
TOKENS = {a: f"tok-{a}-{uuid.uuid4().hex[:6]}" for a in AGENTS}
EXPIRED = "tok-expired"


def _policy(extra_tokens: list[dict[str, str]] | None = None) -> dict[str, object]:
    return {
        "tokens": [{"sha256": hashlib.sha256(TOKENS[a].encode()).hexdigest(), "agent": a} for a in AGENTS]
        + [{"token": EXPIRED, "agent": "writer", "expires_at": "2020-01-01T00:00:00Z"}]
        + (extra_tokens or []),
        "agents": {
            "planner": {"roles": ["orchestrator"], "groups": ["research"], "delegates": ["researcher"]},
            "auditor": {"roles": ["auditor"]},
        },
        "groups": {"research": ["researcher"]},
    }


@pytest.fixture(scope="module")
def policy_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(yaml.safe_dump(_policy()))
    return path


@pytest.fixture(scope="module")
def secured(start_server: ServerFactory, policy_path: Path) -> SidecarThread:
    return start_server(
        auth_required=True, access_policy_file=str(policy_path), access_policy_reload_seconds=0.2
    )


def as_agent(server: SidecarThread, agent: str) -> memlane.Client:
    return memlane.Client(server.target, token=TOKENS[agent], timeout=10)


def test_missing_wrong_and_expired_tokens(secured: SidecarThread) -> None:
    with (
        memlane.Client(secured.target) as anonymous,
        pytest.raises(memlane.UnauthenticatedError, match="requires"),
    ):
        anonymous.get_session(session_id="x")
    with (
        memlane.Client(secured.target, token="nope") as wrong,
        pytest.raises(memlane.UnauthenticatedError, match="not valid"),
    ):
        wrong.get_session(session_id="x")
    with (
        memlane.Client(secured.target, token=EXPIRED) as old,
        pytest.raises(memlane.UnauthenticatedError, match="expired"),
    ):
        old.get_session(session_id="x")
    with (
        memlane.Client(secured.target, agent_id="planner") as header_only,
        pytest.raises(memlane.UnauthenticatedError),
    ):
        header_only.get_session(session_id="x")  # the dev header means nothing once auth is on


def test_auditor_reads_everything_and_writes_nothing(secured: SidecarThread, user_id: str) -> None:
    with as_agent(secured, "researcher") as r:
        sid = r.create_session(user_id=user_id, topology=Topology.TOPOLOGY_DISTRIBUTED).session.session_id
        r.append_messages(
            session_id=sid, messages=[Message(role=Role.ROLE_ASSISTANT, content="private notes")]
        )
    with as_agent(secured, "auditor") as a:
        assert [m.content for m in a.list_messages(session_id=sid).messages] == ["private notes"]
        with pytest.raises(memlane.PermissionDeniedError, match="auditor"):
            a.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="x")])
        with pytest.raises(memlane.PermissionDeniedError, match="auditor"):
            a.close_session(session_id=sid)
        with pytest.raises(memlane.PermissionDeniedError, match="auditor"):
            a.create_session(user_id=user_id)


def test_distributed_memory_is_private_to_its_agent(secured: SidecarThread, user_id: str) -> None:
    with as_agent(secured, "researcher") as r:
        sid = r.create_session(user_id=user_id, topology=Topology.TOPOLOGY_DISTRIBUTED).session.session_id
        r.append_messages(
            session_id=sid, messages=[Message(role=Role.ROLE_ASSISTANT, content="researcher notes")]
        )
        mine = r.list_messages(session_id=sid).messages
        assert [m.content for m in mine] == ["researcher notes"]
        assert (
            mine[0].source_agent_id == "researcher"
            and mine[0].visibility == VisibilityKind.VISIBILITY_KIND_AGENT
        )
    with as_agent(secured, "writer") as w:
        w.append_messages(
            session_id=sid, messages=[Message(role=Role.ROLE_ASSISTANT, content="writer draft")]
        )
        assert [m.content for m in w.list_messages(session_id=sid).messages] == ["writer draft"]
        with pytest.raises(memlane.PermissionDeniedError, match="not the calling agent"):
            w.append_messages(
                session_id=sid,
                messages=[Message(role=Role.ROLE_ASSISTANT, content="spoof", source_agent_id="researcher")],
            )
    with as_agent(secured, "planner") as p:  # the orchestrator reads what it delegated, not the rest
        assert [m.content for m in p.list_messages(session_id=sid).messages] == ["researcher notes"]


def test_selective_group_memory(secured: SidecarThread, user_id: str) -> None:
    with as_agent(secured, "planner") as p:
        sid = p.create_session(
            user_id=user_id, topology=Topology.TOPOLOGY_SELECTIVE, group="research"
        ).session
        p.append_messages(
            session_id=sid.session_id, messages=[Message(role=Role.ROLE_USER, content="group plan")]
        )
    with as_agent(secured, "researcher") as r:
        assert [m.content for m in r.list_messages(session_id=sid.session_id).messages] == ["group plan"]
    with as_agent(secured, "outsider") as o:
        assert list(o.list_messages(session_id=sid.session_id).messages) == []
        with pytest.raises(memlane.PermissionDeniedError, match="not a member of group 'research'"):
            o.append_messages(session_id=sid.session_id, messages=[Message(role=Role.ROLE_USER, content="x")])
        o.append_messages(
            session_id=sid.session_id,
            messages=[
                Message(
                    role=Role.ROLE_USER, content="public", visibility=VisibilityKind.VISIBILITY_KIND_SESSION
                )
            ],
        )
    with as_agent(secured, "researcher") as r:
        assert [m.content for m in r.list_messages(session_id=sid.session_id).messages] == [
            "group plan",
            "public",
        ]


def test_sessions_are_created_as_the_caller(secured: SidecarThread, user_id: str) -> None:
    with as_agent(secured, "writer") as w:
        made = w.create_session(user_id=user_id).session
        assert made.agent_id == "writer"
        with pytest.raises(memlane.PermissionDeniedError, match="not the calling agent"):
            w.create_session(user_id=user_id, agent_id="planner")
        with pytest.raises(memlane.PermissionDeniedError, match="not a member of group 'research'"):
            w.create_session(user_id=user_id, topology=Topology.TOPOLOGY_SELECTIVE, group="research")


@pytest.fixture()
def restore_policy(policy_path: Path) -> Iterator[Path]:
    """Puts the module's policy back whatever the test did, so a failure cannot poison later tests."""
    try:
        yield policy_path
    finally:
        policy_path.write_text(yaml.safe_dump(_policy()))


def test_policy_reload_needs_no_restart(secured: SidecarThread, restore_policy: Path) -> None:
    late = f"tok-late-{uuid.uuid4().hex[:6]}"

    def accepted(c: memlane.Client) -> bool:
        try:
            c.list_sessions(user_id="nobody")
        except memlane.UnauthenticatedError:
            return False
        return True

    with memlane.Client(secured.target, token=late) as c:
        assert not accepted(c)
        restore_policy.write_text(yaml.safe_dump(_policy([{"token": late, "agent": "newcomer"}])))
        wait_for(lambda: accepted(c), timeout=30)
        restore_policy.write_text(yaml.safe_dump(_policy()))
        wait_for(lambda: not accepted(c), timeout=30)  # and a token taken out stops working


def test_auth_disabled_takes_the_agent_header_on_loopback(start_server: ServerFactory, user_id: str) -> None:
    dev = start_server()
    with memlane.Client(dev.target, agent_id="researcher") as r:
        sid = r.create_session(user_id=user_id, topology=Topology.TOPOLOGY_DISTRIBUTED).session.session_id
        r.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="mine")])
        assert [m.content for m in r.list_messages(session_id=sid).messages] == ["mine"]
    with memlane.Client(dev.target, agent_id="writer") as w:
        assert list(w.list_messages(session_id=sid).messages) == []
    assert (
        is_local_peer("ipv4:127.0.0.1:5000") and is_local_peer("ipv6:[::1]:5000") and is_local_peer("unix:/s")
    )
    assert not is_local_peer("ipv4:10.1.2.3:5000") and not is_local_peer("ipv6:[fe80::1]:5000")


# --- property: over random writes, every reader sees exactly what the rule allows ------------------

READERS = ("planner", "researcher", "writer", "outsider", "auditor")
WRITERS = ("planner", "researcher", "writer", "outsider")
GROUPS = {"research": {"planner", "researcher"}}


def allowed(reader: str, vis: int, source: str, group: str) -> bool:
    if reader == "auditor" or vis == VisibilityKind.VISIBILITY_KIND_SESSION:
        return True
    if vis == VisibilityKind.VISIBILITY_KIND_AGENT:
        return reader == source or (reader == "planner" and source == "researcher")
    return reader in GROUPS.get(group, set()) or (reader == "planner" and source == "researcher")


write_op = st.tuples(
    st.sampled_from(WRITERS),
    st.sampled_from(
        [
            VisibilityKind.VISIBILITY_KIND_SESSION,
            VisibilityKind.VISIBILITY_KIND_AGENT,
            VisibilityKind.VISIBILITY_KIND_GROUP,
        ]
    ),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(write_op, min_size=1, max_size=12),
    topology=st.sampled_from(
        [Topology.TOPOLOGY_SHARED, Topology.TOPOLOGY_DISTRIBUTED, Topology.TOPOLOGY_SELECTIVE]
    ),
)
def test_no_message_crosses_a_visibility_boundary(
    secured: SidecarThread, ops: list[tuple[str, VisibilityKind.ValueType]], topology: Topology.ValueType
) -> None:
    user = f"prop-{uuid.uuid4().hex[:8]}"
    clients = {a: as_agent(secured, a) for a in READERS}
    try:
        sid = (
            clients["planner"]
            .create_session(user_id=user, topology=topology, group="research")
            .session.session_id
        )
        expected: list[tuple[str, int, str, str]] = []
        for i, (writer, vis) in enumerate(ops):
            group = "research" if vis == VisibilityKind.VISIBILITY_KIND_GROUP else ""
            msg = Message(role=Role.ROLE_ASSISTANT, content=f"{i}", visibility=vis, visibility_group=group)
            try:
                clients[writer].append_messages(session_id=sid, messages=[msg])
                expected.append((f"{i}", vis, writer, group))
            except memlane.PermissionDeniedError:
                assert vis == VisibilityKind.VISIBILITY_KIND_GROUP and writer not in GROUPS["research"]
        for reader, c in clients.items():
            want = [content for content, vis, src, group in expected if allowed(reader, vis, src, group)]
            got = [m.content for m in c.list_messages(session_id=sid, page_size=1000).messages]
            assert got == want, (reader, expected)
            # The same rule holds for what the reader's model would be shown (auditors read, never prompt).
            assemble = cpb.AssembleContextRequest(
                session_id=sid,
                strategy=cpb.CONTEXT_STRATEGY_FULL_BUFFER,
                context_window_tokens=8000,
                reserved_output_tokens=100,
            )
            if reader == "auditor":
                with pytest.raises(memlane.PermissionDeniedError, match="auditor"):
                    list(c.assemble_context(assemble))
                continue
            shown = [
                m.content
                for r in c.assemble_context(assemble)
                for b in r.blocks
                if b.provenance == cpb.PROVENANCE_CONVERSATION
                for m in b.messages
            ]
            assert shown == want, (reader, expected)
    finally:
        for c in clients.values():
            c.close()
