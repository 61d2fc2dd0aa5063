"""CheckpointService beyond the conformance suite: hostile names, the write rule, the run index, and
export / erasure of a user's framework state."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import redis

import memlane
from memlane.v1 import checkpoint_pb2 as kpb
from memlane_server.background import SidecarThread
from memlane_server.keyspace import KeySpace
from tests.conftest import ServerFactory, raw, wait_for


def _put(c: memlane.Client, sid: str, cid: str, namespace: str = "", metadata_json: str = "") -> None:
    c.put_checkpoint(
        session_id=sid,
        checkpoint_id=cid,
        checkpoint=kpb.TypedValue(type="json", data=b"{}"),
        channel_versions={"a": "1"},
        new_values=[kpb.ChannelValue(channel="a", version="1", value=kpb.TypedValue(type="json", data=b"1"))],
        namespace=namespace,
        metadata_json=metadata_json,
    )


def test_hostile_names_are_refused_and_stored_names_are_exact(client: memlane.Client, user_id: str) -> None:
    sid = client.create_session(user_id=user_id).session.session_id
    for bad in ({"namespace": "a\x00b"}, {"metadata_json": "[1]"}, {"metadata_json": "{not json"}):
        with pytest.raises(memlane.InvalidArgumentError):
            _put(client, sid, "c1", **bad)
    # Lua-, key- and SQL-looking names are just names.
    odd = "ns') OR 1=1 --]]\\{x}*?"
    _put(client, sid, "c1", namespace=odd, metadata_json=json.dumps({"run_id": "r", "k": odd}))
    got = client.get_checkpoint(session_id=sid, namespace=odd)
    assert (
        got.found
        and got.checkpoint.checkpoint_id == "c1"
        and json.loads(got.checkpoint.metadata_json)["k"] == odd
    )
    assert not client.get_checkpoint(session_id=sid, namespace="ns").found
    with pytest.raises(memlane.NotFoundError):
        _put(client, f"nope-{uuid.uuid4().hex}", "c1")
    with pytest.raises(memlane.InvalidArgumentError, match="strategy"):
        client.prune_checkpoints(session_ids=[sid])


def test_export_and_erasure_take_the_checkpoints(
    start_server: ServerFactory,
    redis_url: str,
    user_id: str,
) -> None:
    sidecar: SidecarThread = start_server()
    prefix = sidecar.settings.redis.key_prefix
    marker = f"quokka{uuid.uuid4().hex[:10]}"
    run = f"run-{uuid.uuid4().hex}"
    with memlane.Client(sidecar.target, timeout=60) as c:
        sid = c.create_session(user_id=user_id).session.session_id
        _put(c, sid, "c1", metadata_json=json.dumps({"run_id": run, "note": marker}))
        c.put_checkpoint_writes(
            session_id=sid,
            checkpoint_id="c1",
            writes=[
                kpb.PendingWrite(
                    task_id="t", index=0, channel="ch", value=kpb.TypedValue(type="json", data=b"2")
                )
            ],
        )
        r = redis.Redis.from_url(redis_url)
        assert r.smembers(KeySpace(prefix).checkpoint_run(run)) == {sid.encode()}
        records = [json.loads(x.data) for x in c.export_user_data(user_id=user_id) if x.kind == "checkpoint"]
        assert len(records) == 1 and records[0]["metadata"]["note"] == marker
        assert records[0]["pending_writes"][0]["channel"] == "ch"
        stored = r.hget(KeySpace(prefix).checkpoints(sid).data, "\x00c1") or b""
        assert marker.encode() in stored  # positive control for the erasure below

        c.forget_user(user_id=user_id)
        assert list(r.scan_iter(KeySpace(prefix).session_pattern(sid))) == []
        assert r.smembers(KeySpace(prefix).checkpoint_run(run)) == set()
        assert not c.get_checkpoint(session_id=sid).found
        r.close()


def test_auditors_read_checkpoints_but_never_write_them(
    start_server: ServerFactory, tmp_path: Path, user_id: str
) -> None:
    import yaml  # noqa: PLC0415

    policy = tmp_path / "policy.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "tokens": [{"token": "bot", "agent": "bot"}, {"token": "aud", "agent": "auditor"}],
                "agents": {"auditor": {"roles": ["auditor"]}},
            }
        )
    )
    sidecar: SidecarThread = start_server(auth_required=True, access_policy_file=str(policy))
    with (
        memlane.Client(sidecar.target, token="bot", timeout=10) as bot,
        memlane.Client(sidecar.target, token="aud", timeout=10) as auditor,
    ):
        sid = bot.create_session(user_id=user_id).session.session_id
        _put(bot, sid, "c1")
        assert auditor.get_checkpoint(session_id=sid).found
        with pytest.raises(memlane.PermissionDeniedError):
            _put(auditor, sid, "c2")
        with pytest.raises(memlane.PermissionDeniedError):
            auditor.delete_checkpoints(session_id=sid)
        assert bot.get_checkpoint(session_id=sid).checkpoint.checkpoint_id == "c1"


def test_a_retired_thread_gets_its_checkpoints_back(
    start_server: ServerFactory, redis_url: str, tmp_path: Path, user_id: str
) -> None:
    from langchain_core.runnables import RunnableConfig  # noqa: PLC0415
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata  # noqa: PLC0415

    from memlane.integrations.langgraph import MemlaneSaver  # noqa: PLC0415

    policies = tmp_path / "p.yaml"
    policies.write_text("channels:\n  langgraph: {kind: messaging, hot_retention: 0}\n")
    srv: SidecarThread = start_server(ltm_enabled=False, channel_policies_file=str(policies))
    keys = srv.sidecar.keys
    r = redis.Redis.from_url(redis_url)
    saver = MemlaneSaver(srv.target, user_id=user_id)
    thread = f"thread-{uuid.uuid4().hex[:8]}"
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    cp = generate_checkpoint(channel_values={"notes": ["keep", "me"]}, channel_versions={"notes": 1})
    stored = saver.put(config, cp, generate_metadata(step=3, run_id="r1"), {"notes": 1})
    saver.put_writes(stored, [("notes", "pending")], "task-1")
    with memlane.Client(srv.target, timeout=60) as c:
        c.promote_session(session_id=thread, close=True)
        wait_for(lambda: r.hget(keys.session(thread).doc, "retired_at_ms"))
        # Retired: the hot state is gone from Redis, the archive holds it.
        assert not r.exists(keys.checkpoints(thread).index) and not r.exists(keys.checkpoints(thread).blobs)
        assert raw(r.hget(keys.session(thread).doc, "checkpoints_uri")).endswith(b".parquet")
        archived = [x for x in c.export_user_data(user_id=user_id) if x.kind == "archive.checkpoints"]
        assert archived, "the archive's checkpoints show in the user's export"

        back = saver.get_tuple({"configurable": {"thread_id": thread, "checkpoint_ns": ""}})
        assert back is not None and back.checkpoint["id"] == cp["id"]
        assert back.checkpoint["channel_values"] == {"notes": ["keep", "me"]}
        assert back.metadata["step"] == 3 and back.pending_writes == [("task-1", "notes", "pending")]
        assert c.get_session(session_id=thread).session.status == memlane.SessionStatus.SESSION_STATUS_ACTIVE
    saver.close()
    r.close()


def test_checkpoints_are_never_copied_into_another_users_session(
    client: memlane.Client, user_id: str
) -> None:
    """CopyCheckpoints into an existing session of another user would put one user's framework state in
    another's thread (their agent reads it, and erasing the first user leaves it there)."""
    other = f"{user_id}-other"
    marker = f"wombat{uuid.uuid4().hex[:8]}"
    src = client.create_session(user_id=user_id).session.session_id
    _put(client, src, "c1", metadata_json=json.dumps({"note": marker}))
    foreign = client.create_session(user_id=other).session.session_id
    with pytest.raises(memlane.AlreadyExistsError, match="target_session_id"):
        client.copy_checkpoints(source_session_id=src, target_session_id=foreign)
    assert not client.get_checkpoint(session_id=foreign).found
    assert [x.data for x in client.export_user_data(user_id=other) if marker.encode() in x.data] == []
    # positive controls: into the same user's existing session, and into a new one made for that user
    same = client.create_session(user_id=user_id).session.session_id
    assert client.copy_checkpoints(source_session_id=src, target_session_id=same).copied == 1
    assert marker in client.get_checkpoint(session_id=same).checkpoint.metadata_json
    fresh = f"fork-{uuid.uuid4().hex}"
    assert client.copy_checkpoints(source_session_id=src, target_session_id=fresh).copied == 1
    assert client.get_session(session_id=fresh).session.user_id == user_id


def test_checkpoints_deleted_from_a_retired_thread_stay_deleted(
    start_server: ServerFactory, redis_url: str, tmp_path: Path, user_id: str
) -> None:
    policies = tmp_path / "p.yaml"
    policies.write_text("channels:\n  langgraph: {kind: messaging, hot_retention: 0}\n")
    srv: SidecarThread = start_server(ltm_enabled=False, channel_policies_file=str(policies))
    keys = srv.sidecar.keys
    r = redis.Redis.from_url(redis_url)

    def retired(sid: str) -> bool:
        return bool(r.hget(keys.session(sid).doc, "retired_at_ms"))

    with memlane.Client(srv.target, timeout=60) as c:
        kept, dropped, pruned, ran, again = (f"thread-{uuid.uuid4().hex[:8]}" for _ in range(5))
        run = f"run-{uuid.uuid4().hex[:8]}"
        for sid in (kept, dropped, pruned, ran, again):
            c.create_session(session_id=sid, user_id=user_id, channel="langgraph")
            _put(c, sid, "c1", metadata_json=json.dumps({"run_id": run}) if sid == ran else "")
            c.promote_session(session_id=sid, close=True)
        wait_for(lambda: all(retired(s) for s in (kept, dropped, pruned, ran, again)))
        # Positive control: a retired thread's checkpoint comes back from the archive.
        assert c.get_checkpoint(session_id=kept).checkpoint.checkpoint_id == "c1"

        # Deleted while retired: gone, also once the thread is resumed.
        assert c.delete_checkpoints(session_id=dropped).deleted == 1
        assert not c.get_checkpoint(session_id=dropped).found
        strategy = kpb.PRUNE_STRATEGY_DELETE
        assert c.prune_checkpoints(session_ids=[pruned], strategy=strategy).deleted == 1
        assert not c.get_checkpoint(session_id=pruned).found
        assert c.delete_checkpoint_runs(run_ids=[run]).deleted == 1
        assert not c.get_checkpoint(session_id=ran).found

        # Deleted after a resumption, then retired again: the first archive does not bring it back.
        assert c.get_checkpoint(session_id=again).found  # resumes it
        assert c.delete_checkpoints(session_id=again).deleted == 1
        c.promote_session(session_id=again, close=True)
        wait_for(lambda: retired(again))
        assert not c.get_checkpoint(session_id=again).found
    r.close()
