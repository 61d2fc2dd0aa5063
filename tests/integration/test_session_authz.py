"""Who may change or close a session, through the real server with auth on: its creating agent, an
orchestrator for the agents it delegates to, an admin. Every other agent and every auditor is refused,
field by field of UpdateSession's mask, and for CloseSession and PromoteSession(close)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf.field_mask_pb2 import FieldMask

import memlane
from memlane import Topology
from memlane.v1 import checkpoint_pb2 as kpb
from memlane.v1 import session_pb2 as pb
from memlane_server.background import SidecarThread
from tests.access_policy import as_agent, write_policy
from tests.conftest import ServerFactory

OWNER = "researcher"  # planner orchestrates researcher; both are in group "research"
REFUSED = ("writer", "outsider", "auditor")
ALLOWED = (OWNER, "planner", "admin")

# Each updatable field, and a value to set it to (a new one per allowed actor, so every change shows).
FIELDS: dict[str, Any] = {
    "tags": lambda i: {"tags": [f"t{i}"]},
    "metadata": lambda i: {"metadata": {"k": f"v{i}"}},
    "participants": lambda i: {"participants": [f"p{i}"]},
    "group": lambda i: {"group": "research"},
    "model": lambda i: {"model": f"gpt-4o-{i}"},
    "ttl_seconds": lambda i: {"ttl_seconds": 600 + i},
    "status": lambda i: {"status": pb.SESSION_STATUS_IDLE},
}


@pytest.fixture(scope="module")
def secured(start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> SidecarThread:
    path = write_policy(tmp_path_factory.mktemp("policy") / "policy.yaml")
    return start_server(auth_required=True, access_policy_file=str(path))


def _new_session(server: SidecarThread, user_id: str) -> pb.Session:
    with as_agent(server, OWNER) as c:
        return c.create_session(user_id=user_id, topology=Topology.TOPOLOGY_DISTRIBUTED).session


def _update(c: memlane.Client, session_id: str, path: str, values: dict[str, Any]) -> pb.Session:
    return c.update_session(
        session=pb.Session(session_id=session_id, **values), update_mask=FieldMask(paths=[path])
    ).session


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_only_the_owner_its_orchestrator_and_admins_update_a_session(
    secured: SidecarThread, user_id: str, path: str
) -> None:
    sid = _new_session(secured, user_id).session_id
    with as_agent(secured, OWNER) as owner:
        before = owner.get_session(session_id=sid).session
    for i, actor in enumerate(REFUSED):
        with as_agent(secured, actor) as c, pytest.raises(memlane.PermissionDeniedError):
            _update(c, sid, path, FIELDS[path](100 + i))
        with as_agent(secured, OWNER) as owner:
            after = owner.get_session(session_id=sid).session
            assert getattr(after, path) == getattr(before, path), f"{actor} changed {path}"
    for i, actor in enumerate(ALLOWED):  # positive controls: each of them may, and the change shows
        values = FIELDS[path](i)
        with as_agent(secured, actor) as c:
            updated = _update(c, sid, path, values)
        got = getattr(updated, path)
        want = values[path]
        assert (
            dict(got) if path == "metadata" else list(got) if path in ("tags", "participants") else got
        ) == want


def test_an_owner_cannot_move_its_session_into_a_foreign_group(secured: SidecarThread, user_id: str) -> None:
    with as_agent(secured, "writer") as w:
        sid = w.create_session(user_id=user_id).session.session_id
        with pytest.raises(memlane.PermissionDeniedError, match="not a member of group 'research'"):
            _update(w, sid, "group", {"group": "research"})
        assert _update(w, sid, "tags", {"tags": ["mine"]}).tags == ["mine"]  # positive control


@pytest.mark.parametrize("actor", [*REFUSED, *ALLOWED])
def test_only_the_owner_its_orchestrator_and_admins_close_a_session(
    secured: SidecarThread, user_id: str, actor: str
) -> None:
    for close in ("close_session", "promote_session"):
        sid = _new_session(secured, user_id).session_id
        with as_agent(secured, actor) as c:
            kw: dict[str, Any] = {"close": True} if close == "promote_session" else {}
            if actor in REFUSED:
                with pytest.raises(memlane.PermissionDeniedError):
                    getattr(c, close)(session_id=sid, **kw)
            else:
                getattr(c, close)(session_id=sid, **kw)
        with as_agent(secured, OWNER) as owner:
            status = owner.get_session(session_id=sid).session.status
        assert (status == pb.SESSION_STATUS_CLOSED) == (actor in ALLOWED), (actor, close, status)


def test_updating_or_closing_a_missing_session_is_not_found(secured: SidecarThread) -> None:
    with as_agent(secured, "outsider") as c:
        with pytest.raises(memlane.NotFoundError):
            c.close_session(session_id="no-such-session")
        with pytest.raises(memlane.NotFoundError):
            _update(c, "no-such-session", "tags", {"tags": ["x"]})


def test_participants_describe_and_grant_nothing(secured: SidecarThread, user_id: str) -> None:
    """The contract (session.proto): `participants` is descriptive. Session-wide turns reach every agent
    of the user, listed or not; being listed opens no private turn."""
    with as_agent(secured, OWNER) as r:
        sid = r.create_session(user_id=user_id, participants=["researcher", "writer"]).session.session_id
        r.append_messages(
            session_id=sid,
            messages=[
                memlane.Message(role=memlane.Role.ROLE_USER, content="for everyone"),
                memlane.Message(
                    role=memlane.Role.ROLE_ASSISTANT,
                    content="researcher only",
                    visibility=memlane.VisibilityKind.VISIBILITY_KIND_AGENT,
                ),
            ],
        )
        assert [m.content for m in r.list_messages(session_id=sid).messages] == [
            "for everyone",
            "researcher only",
        ]
    for reader in ("writer", "outsider"):  # listed and unlisted read the same: the session-wide turn
        with as_agent(secured, reader) as c:
            assert [m.content for m in c.list_messages(session_id=sid).messages] == ["for everyone"]


def _put_checkpoint(c: memlane.Client, sid: str, cid: str, run: str) -> None:
    c.put_checkpoint(
        session_id=sid,
        checkpoint_id=cid,
        checkpoint=kpb.TypedValue(type="json", data=b"{}"),
        metadata_json=json.dumps({"run_id": run}),
    )


def test_only_the_owner_its_orchestrator_and_admins_delete_a_sessions_checkpoints(
    secured: SidecarThread, user_id: str
) -> None:
    """Deleting, pruning or deleting by run destroys a session's framework state: the rule of
    CloseSession, not the write rule (any agent may write session-wide)."""
    run = f"run-{uuid.uuid4().hex}"
    destroy: dict[str, Callable[[memlane.Client, str], object]] = {
        "delete_checkpoints": lambda c, sid: c.delete_checkpoints(session_id=sid),
        "prune_checkpoints(delete)": lambda c, sid: c.prune_checkpoints(
            session_ids=[sid], strategy=kpb.PRUNE_STRATEGY_DELETE
        ),
        "prune_checkpoints(keep_latest)": lambda c, sid: c.prune_checkpoints(
            session_ids=[sid], strategy=kpb.PRUNE_STRATEGY_KEEP_LATEST
        ),
        "delete_checkpoint_runs": lambda c, sid: c.delete_checkpoint_runs(run_ids=[run]),
    }
    for name, call in destroy.items():
        for actor in (*REFUSED, *ALLOWED):
            sid = _new_session(secured, user_id).session_id
            with as_agent(secured, OWNER) as owner:
                _put_checkpoint(owner, sid, "c1", run)
                _put_checkpoint(owner, sid, "c2", run)
            with as_agent(secured, actor) as c:
                if actor in REFUSED:
                    with pytest.raises(memlane.PermissionDeniedError):
                        call(c, sid)
                else:  # positive control: they may, and the checkpoints are gone
                    call(c, sid)
            with as_agent(secured, OWNER) as owner:
                left = [x.checkpoint_id for x in owner.list_checkpoints(session_id=sid).checkpoints]
            if actor in REFUSED:
                assert sorted(left) == ["c1", "c2"], f"{actor} destroyed checkpoints by {name}"
            else:
                assert len(left) < 2, f"{actor} could not {name}"


def test_a_removal_receipt_is_replayed_only_to_whoever_could_remove_its_messages(
    secured: SidecarThread, user_id: str
) -> None:
    """RemoveMessages keeps its answer (the removed messages) under the request id, so a retry gets it
    again; another agent naming the same request id must not get the owner's private turns that way."""
    sid = _new_session(secured, user_id).session_id  # distributed: turns are private to their writer
    secret = f"secret-{uuid.uuid4().hex[:8]}"
    rid = f"pop-{uuid.uuid4().hex[:8]}"
    with as_agent(secured, OWNER) as owner:
        owner.append_messages(session_id=sid, messages=[pb.Message(role=pb.ROLE_USER, content=secret)])
        first = owner.remove_messages(session_id=sid, request_id=rid, last=1)
        assert [m.content for m in first.removed] == [secret]
        # positive control: the owner's own retry replays the answer
        assert [m.content for m in owner.remove_messages(session_id=sid, request_id=rid, last=1).removed] == [
            secret
        ]
    with as_agent(secured, "writer") as w:
        w.append_messages(session_id=sid, messages=[pb.Message(role=pb.ROLE_USER, content="mine")])
        with pytest.raises(memlane.PermissionDeniedError):
            w.remove_messages(session_id=sid, request_id=rid, message_ids=["no-such-message"])
        with pytest.raises(memlane.PermissionDeniedError):
            w.remove_messages(session_id=sid, request_id=rid, last=1)  # its own last turn, the owner's id
        with pytest.raises(memlane.PermissionDeniedError):  # every message left is its own
            w.remove_messages(session_id=sid, request_id=rid, all=True)
        # positive control: the writer removes its own turn under a request id of its own
        own = w.remove_messages(session_id=sid, request_id=f"{rid}-w", last=1)
        assert [m.content for m in own.removed] == ["mine"]


@pytest.mark.parametrize(
    "case",
    [
        # distributed: the owner's private memory; its orchestrator and auditors read it
        (Topology.TOPOLOGY_DISTRIBUTED, "", {OWNER, "planner", "auditor"}, {OWNER}),
        # selective: the group's (planner and researcher), auditors read it
        (Topology.TOPOLOGY_SELECTIVE, "research", {OWNER, "planner", "auditor"}, {OWNER, "planner"}),
        # shared: session-wide (positive control: every agent reads, every non-auditor writes)
        (
            Topology.TOPOLOGY_SHARED,
            "",
            {*REFUSED, *ALLOWED},
            {OWNER, "planner", "writer", "outsider", "admin"},
        ),
    ],
)
def test_checkpoints_follow_the_topologys_visibility(
    secured: SidecarThread, user_id: str, case: tuple[Topology.ValueType, str, set[str], set[str]]
) -> None:
    """A framework checkpoint holds the agent's whole state (its private turns too): in a distributed
    session another agent must not read it through GetCheckpoint, ListCheckpoints or CopyCheckpoints."""
    topology, group, readers, writers = case
    with as_agent(secured, OWNER) as owner:
        sid = owner.create_session(user_id=user_id, topology=topology, group=group).session.session_id
        _put_checkpoint(owner, sid, "c1", f"run-{uuid.uuid4().hex}")
    for actor in (*REFUSED, *ALLOWED):
        with as_agent(secured, actor) as c:
            if actor in readers:
                assert c.get_checkpoint(session_id=sid, checkpoint_id="c1").found, actor
                assert "c1" in [x.checkpoint_id for x in c.list_checkpoints(session_id=sid).checkpoints]
            else:
                with pytest.raises(memlane.PermissionDeniedError):
                    c.get_checkpoint(session_id=sid)
                with pytest.raises(memlane.PermissionDeniedError):
                    c.list_checkpoints(session_id=sid)
                with pytest.raises(memlane.PermissionDeniedError):
                    c.copy_checkpoints(source_session_id=sid, target_session_id=f"fork-{uuid.uuid4().hex}")
            if actor in writers:
                _put_checkpoint(c, sid, f"c-{actor}", "r")
            else:
                with pytest.raises(memlane.PermissionDeniedError):
                    _put_checkpoint(c, sid, f"c-{actor}", "r")
    with as_agent(secured, "auditor") as a:
        written = {x.checkpoint_id for x in a.list_checkpoints(session_id=sid).checkpoints}
    assert written == {"c1", *(f"c-{w}" for w in writers)}
