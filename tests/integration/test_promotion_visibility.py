"""Promotion keeps the access rule: a memory derived from a message is never visible to a reader who could
not read that message, and it belongs to the agent that wrote the message. Through the real server: real
Redis, LanceDB, ONNX embeddings, the rules extractor, the gRPC client."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memlane
from memlane import Message, Role, Topology, VisibilityKind
from memlane.v1 import context_pb2 as cpb
from memlane.v1 import memory_pb2 as mpb
from memlane_server.background import SidecarThread
from tests.access_policy import as_agent, can_read_message, write_policy
from tests.conftest import ServerFactory

READERS = ("planner", "researcher", "writer", "outsider", "auditor")
SESSION, AGENT, GROUP = (
    VisibilityKind.VISIBILITY_KIND_SESSION,
    VisibilityKind.VISIBILITY_KIND_AGENT,
    VisibilityKind.VISIBILITY_KIND_GROUP,
)


@pytest.fixture(scope="module")
def secured(start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> SidecarThread:
    path = write_policy(tmp_path_factory.mktemp("policy") / "policy.yaml")
    return start_server(auth_required=True, access_policy_file=str(path))


def _caller(user: str) -> mpb.Caller:
    return mpb.Caller(user_id=user)


def recalled(c: memlane.Client, user: str, query: str) -> list[mpb.Memory]:
    return [r.memory for r in c.search_memories(caller=_caller(user), query=query, limit=100).results]


def profile(c: memlane.Client, user: str) -> list[mpb.Memory]:
    p = c.get_profile(caller=_caller(user), max_items=100, max_chars=100_000)
    return [*p.instructions, *p.preferences, *p.facts]


def assembled_ids(c: memlane.Client, session_id: str, query: str) -> set[str]:
    """Memory ids in the profile and memory blocks of one assembly."""
    ids: set[str] = set()
    for resp in c.assemble_context(session_id=session_id, user_input=query, model="gpt-4o"):
        for b in resp.blocks:
            if b.provenance in (cpb.PROVENANCE_PROFILE, cpb.PROVENANCE_MEMORY):
                ids |= {m.memory_id for m in b.memories}
    return ids


def _say(
    c: memlane.Client,
    sid: str,
    text: str,
    visibility: VisibilityKind.ValueType = VisibilityKind.VISIBILITY_KIND_UNSPECIFIED,
    visibility_group: str = "",
) -> str:
    msg = Message(role=Role.ROLE_USER, content=text, visibility=visibility, visibility_group=visibility_group)
    return c.append_messages(session_id=sid, messages=[msg]).results[0].message_id


def test_a_private_turn_is_promoted_into_its_writers_scope_only(secured: SidecarThread, user_id: str) -> None:
    with (
        as_agent(secured, "planner") as p,
        as_agent(secured, "writer") as w,
        as_agent(secured, "outsider") as o,
    ):
        sid = p.create_session(user_id=user_id, topology=Topology.TOPOLOGY_DISTRIBUTED).session.session_id
        lisbon = _say(w, sid, "I live in Lisbon.")  # private to writer (the distributed default)
        shared = _say(o, sid, "I really love mangoes.", visibility=SESSION)
        p.promote_session(session_id=sid, close=True)

        # Positive control: the writer recalls its own private fact, in search, profile and episode.
        mine = recalled(w, user_id, "where does the user live")
        fact = [m for m in mine if m.content == "User lives in Lisbon."]
        assert fact and fact[0].agent_id == "writer" and fact[0].scope == mpb.MEMORY_SCOPE_AGENT
        assert "User lives in Lisbon." in [m.content for m in profile(w, user_id)]
        episodes = [m for m in mine if m.kind == mpb.MEMORY_KIND_EPISODIC and lisbon in m.source_message_ids]
        assert episodes and {e.agent_id for e in episodes} == {"writer"}  # the writer, not the creator
        private = {m.memory_id for m in mine if lisbon in m.source_message_ids}

        # The session-wide turn is a user-scope fact every agent recalls (positive control for the others).
        for c in (p, o, w):
            assert "User likes mangoes." in [m.content for m in profile(c, user_id)]
        # Nobody else recalls the private turn, by search, profile or assembly.
        for c in (p, o):
            got = recalled(c, user_id, "where does the user live Lisbon")
            assert got, "the search itself works (the mangoes items match)"
            assert not [m for m in got if lisbon in m.source_message_ids or "Lisbon" in m.content]
            assert not [m for m in profile(c, user_id) if "Lisbon" in m.content]
            own = c.create_session(user_id=user_id).session.session_id
            ids = assembled_ids(c, own, "where does the user live? Lisbon?")
            assert ids and not ids & private
        assert shared  # written as outsider, session-wide
        # The session's summary is read by every reader: the shared turn is in it, the private one not.
        summary = o.get_session(session_id=sid).session.summary
        assert "mangoes" in summary.text and "Lisbon" not in summary.text


def test_a_group_turn_is_promoted_into_its_group(secured: SidecarThread, user_id: str) -> None:
    with (
        as_agent(secured, "planner") as p,
        as_agent(secured, "researcher") as r,
        as_agent(secured, "writer") as w,
    ):
        sid = p.create_session(
            user_id=user_id, topology=Topology.TOPOLOGY_SELECTIVE, group="research"
        ).session.session_id
        porto = _say(r, sid, "I live in Porto.")  # the session's group by default
        p.promote_session(session_id=sid, close=True)
        for member in (p, r):  # positive control: both members recall it
            got = [
                m
                for m in recalled(member, user_id, "where does the user live")
                if porto in m.source_message_ids
            ]
            assert got and all(m.scope == mpb.MEMORY_SCOPE_GROUP and m.group == "research" for m in got)
            assert {m.agent_id for m in got} == {"researcher"}
        assert not [m for m in recalled(w, user_id, "where does the user live Porto") if "Porto" in m.content]
        assert not [m for m in profile(w, user_id) if "Porto" in m.content]


def test_a_private_restatement_never_rewrites_a_shared_fact(secured: SidecarThread, user_id: str) -> None:
    """Merge and supersede stay inside one audience: a private turn must not reword or retire a fact others
    read."""
    with as_agent(secured, "writer") as w, as_agent(secured, "outsider") as o:
        first = w.create_session(user_id=user_id).session.session_id
        _say(w, first, "I live in Madrid.")
        w.promote_session(session_id=first, close=True)
        assert "User lives in Madrid." in [m.content for m in profile(o, user_id)]
        second = w.create_session(user_id=user_id, topology=Topology.TOPOLOGY_DISTRIBUTED).session.session_id
        _say(w, second, "I live in Seville.")
        w.promote_session(session_id=second, close=True)
        assert "User lives in Seville." in [m.content for m in profile(w, user_id)]  # positive control
        seen = [m.content for m in profile(o, user_id)]
        assert "User lives in Madrid." in seen and not [t for t in seen if "Seville" in t]


# --- property: over random multi-agent sessions x topologies, after promotion every reader recalls only
# what it could read in the session --------------------------------------------------------------------

WRITERS = ("planner", "researcher", "writer", "outsider")
LIKES = ("mangoes", "sailing", "chess", "opera", "hiking", "pottery", "jazz", "tennis", "origami", "sushi")
write_op = st.tuples(st.sampled_from(WRITERS), st.sampled_from([SESSION, AGENT, GROUP]))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(write_op, min_size=1, max_size=8),
    topology=st.sampled_from(
        [Topology.TOPOLOGY_SHARED, Topology.TOPOLOGY_DISTRIBUTED, Topology.TOPOLOGY_SELECTIVE]
    ),
)
def test_no_memory_crosses_a_visibility_boundary_after_promotion(
    secured: SidecarThread, ops: list[tuple[str, VisibilityKind.ValueType]], topology: Topology.ValueType
) -> None:
    user = f"prop-{uuid.uuid4().hex[:8]}"
    clients = {a: as_agent(secured, a) for a in READERS}
    try:
        sid = clients["planner"].create_session(user_id=user, topology=topology, group="research")
        sid_ = sid.session.session_id
        # message id -> (visibility, source agent, group)
        written: dict[str, tuple[VisibilityKind.ValueType, str, str]] = {}
        for i, (writer, vis) in enumerate(ops):
            group = "research" if vis == GROUP else ""
            text = f"I really love {LIKES[i % len(LIKES)]} number {i}."
            try:
                mid = _say(clients[writer], sid_, text, visibility=vis, visibility_group=group)
                written[mid] = (vis, writer, group)
            except memlane.PermissionDeniedError:
                assert vis == GROUP and writer not in ("planner", "researcher")
        clients["planner"].promote_session(session_id=sid_, close=True)

        def readable(reader: str, m: mpb.Memory) -> bool:
            return all(can_read_message(reader, *written[s]) for s in m.source_message_ids)

        every = {
            m.memory_id: m
            for m in clients["auditor"].list_memories(caller=mpb.Caller(user_id=user), page_size=500).memories
        }
        for m in every.values():  # authorship: a memory's agent wrote every message it came from
            assert {written[s][1] for s in m.source_message_ids} == {m.agent_id}, m
        for reader, c in clients.items():
            seen = recalled(c, user, "what does the user love") + profile(c, user)
            for m in seen:
                assert readable(reader, m), (reader, m, written)
            if reader != "auditor":  # auditors write nothing, so they assemble on no session of their own
                own = c.create_session(user_id=user).session.session_id
                for mid in assembled_ids(c, own, "what does the user love?"):
                    assert readable(reader, every[mid]), (reader, every[mid], written)
            # Positive control: each writer recalls every fact from its own turns (private ones included).
            for mid, (vis, source, _group) in written.items():
                if source == reader and (vis != GROUP or reader in ("planner", "researcher")):
                    assert [m for m in seen if mid in m.source_message_ids], (reader, mid, written)
    finally:
        for c in clients.values():
            c.close()
