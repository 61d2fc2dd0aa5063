"""Issue 41, item 2: an import is checked whole before anything is written. Each test drives the real
server through the real client (or the real ``memlane import-user`` command) with a file written by
hand the way a hostile or damaged export would be, and shows the refusal (INVALID_ARGUMENT naming the
line and field, nothing written) beside the legitimate file that still imports."""

from __future__ import annotations

import hashlib
import json
import time
import unicodedata
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from google.protobuf.field_mask_pb2 import FieldMask

import memlane
from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import procedure_pb2 as ppb
from memlane.v1 import session_pb2 as spb
from memlane_server.background import SidecarThread
from memlane_server.cli import main
from tests.conftest import ServerFactory


def _user(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def _file(user: str, *records: dict[str, Any]) -> bytes:
    head = {"record": "header", "format": "memlane.user-export", "format_version": 1, "user_id": user}
    return b"".join(orjson.dumps(r) + b"\n" for r in (head, *records))


def _session(user: str, sid: str, **fields: Any) -> dict[str, Any]:
    return {"record": "session", "session_id": sid, "user_id": user, **fields}


def _turn(sid: str, seq: int, content: str, **fields: Any) -> dict[str, Any]:
    return {
        "record": "message",
        "session_id": sid,
        "message_id": f"m{seq}",
        "seq": seq,
        "role": "user",
        "content": content,
        **fields,
    }


def _memory(user: str, mid: str, content: str, **fields: Any) -> dict[str, Any]:
    return {
        "record": "memory",
        "id": mid,
        "user_id": user,
        "content": content,
        "kind": "fact",
        "scope": "user",
        **fields,
    }


def _doc(user: str, mid: str, content: str, at_ms: int) -> dict[str, Any]:
    """An item as versions and snapshots carry it (its stored columns)."""
    return {
        "id": mid,
        "user_id": user,
        "content": content,
        "kind": "fact",
        "scope": "user",
        "created_at_ms": at_ms,
        "updated_at_ms": at_ms,
        "metadata_json": "{}",
    }


def _nothing_of(c: memlane.Client, user: str) -> bool:
    return (
        c.list_users(query=user).users == []
        and b"".join(r.data for r in c.export_user_data(user_id=user)) == b""
    )


def test_a_decomposed_user_id_lands_under_its_nfc_form(client: memlane.Client) -> None:
    """A header naming the user in NFD (e + combining accent) used to store the data under that form,
    which no request can name (the API puts every id in NFC): ForgetUser with either form erased
    nothing. Now the file's ids are put in NFC as request fields are."""
    tag = uuid.uuid4().hex[:8]
    nfc, nfd = f"José-{tag}", unicodedata.normalize("NFD", f"José-{tag}")
    assert nfc != nfd
    sid = f"s-{tag}"
    data = _file(
        nfd,
        _session(nfd, sid, participants=orjson.dumps([nfd]).decode()),  # as a session document holds it
        _turn(sid, 1, "Hello from Lisbon.", user_id=nfd),
        _memory(nfd, f"mem-{tag}", "Lives in Lisbon."),
    )
    receipt = client.import_user_data(data=data)
    assert receipt.user_id == nfc and receipt.imported["memory"] == 1
    assert [u.user_id for u in client.list_users(query=tag).users] == [nfc]
    assert client.get_session(session_id=sid).session.user_id == nfc
    assert [m.content for m in client.list_memories(caller=mpb.Caller(user_id=nfc)).memories] == [
        "Lives in Lisbon."
    ]
    erased = client.forget_user(user_id=nfd)  # either form names the one user
    assert erased.erased["lancedb.items"] == 1 and erased.erased["redis.sessions"] == 1
    assert client.list_users(query=tag).users == []
    # Control: the NFC form imports as it always did.
    assert client.import_user_data(data=data.replace(nfd.encode(), nfc.encode())).user_id == nfc
    client.forget_user(user_id=nfc)


def _large_file(user: str, turns: int, *, extra: tuple[dict[str, Any], ...] = ()) -> tuple[bytes, str]:
    """One session of ``turns`` turns of 200 KB (cheap text) and a few memories: 200 KB a turn."""
    sid = f"big-{uuid.uuid4().hex[:8]}"
    records = [
        _session(user, sid, last_seq=turns, message_count=turns),
        *(_turn(sid, seq, f"turn {seq} " + "x" * 200_000) for seq in range(1, turns + 1)),
        *(_memory(user, f"{sid}-mem{i}", f"Keeps {i} plants on the balcony.") for i in range(3)),
        *extra,
    ]
    return _file(user, *records), sid


def test_import_user_streams_a_large_file_whole(
    server: SidecarThread, client: memlane.Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``memlane import-user`` of an export over 8 MiB used to send each 8 MiB as its own import, the
    later ones merged into a session the first had written: their turns were skipped (41 of 60 came
    back, exit 0). The parts now go under one upload id and the file is imported whole: an honest
    20 MB file comes back complete, a re-import with --merge adds nothing, a bad record in the last
    part refuses the whole file."""
    address = ["--address", server.target]
    user = _user("large")
    data, sid = _large_file(user, 100)
    assert len(data) > 20_000_000
    path = tmp_path / "large.jsonl"
    path.write_bytes(data)
    assert main(["import-user", str(path), *address]) == 0
    receipt = json.loads(capsys.readouterr().out)
    assert receipt["imported"] == {"memory": 3, "message": 100, "session": 1}
    stored = list(
        memlane.iter_pages(
            lambda t: client.list_messages(session_id=sid, page_size=50, page_token=t), "messages"
        )
    )
    assert [m.seq for m in stored] == list(range(1, 101))
    assert stored[-1].content.startswith("turn 100 ")
    # A re-import with --merge: the same file adds nothing; with one record more, that record alone.
    assert main(["import-user", str(path), "--merge", *address]) == 0
    again = capsys.readouterr()
    assert json.loads(again.out)["imported"] == {} and "nothing new" in again.err
    more, _ = _large_file(user, 50, extra=(_memory(user, f"extra-{sid}", "Plays the cello."),))
    path.write_bytes(more)
    assert main(["import-user", str(path), "--merge", *address]) == 0
    assert json.loads(capsys.readouterr().out)["imported"] == {"memory": 4, "message": 50, "session": 1}
    # A bad record after the first 8 MiB: refused whole, nothing of the file written.
    other = _user("large-bad")
    bad, _ = _large_file(other, 60, extra=(_memory(other, "x{1}", "Bad id."),))
    path.write_bytes(bad)
    assert main(["import-user", str(path), *address]) == 1
    err = capsys.readouterr().err
    last_line = bad.count(b"\n")  # the bad record is the file's last line
    assert f"line {last_line} (memory): id 'x{{1}}'" in err, err
    assert _nothing_of(client, other)


_OPS_TOKEN = f"tok-ops-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def auto(start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> SidecarThread:
    """Auth on, one admin agent ("ops"), and agents' proposals live without an operator."""
    policy = tmp_path_factory.mktemp("policy") / "policy.yaml"
    digest = hashlib.sha256(_OPS_TOKEN.encode()).hexdigest()
    policy.write_text(
        yaml.safe_dump(
            {"tokens": [{"sha256": digest, "agent": "ops"}], "agents": {"ops": {"roles": ["admin"]}}}
        )
    )
    return start_server(auth_required=True, access_policy_file=str(policy), procedure_approval="auto")


def _procedure(origin: str, by: str, owner: str = "a:support-bot", **fields: Any) -> dict[str, Any]:
    return {
        "record": "procedure",
        "owner": owner,
        "procedure_id": f"refunds-{uuid.uuid4().hex[:6]}",
        "kind": "routine",
        "origin": origin,
        "proposed_by": by,
        "content": "For a refund: confirm the order number, then refund to the original card.",
        **fields,
    }


def test_a_file_names_only_its_importer_as_a_procedures_proposer(auto: SidecarThread) -> None:
    """With ``procedure_approval: auto`` a version an agent proposes goes live in every user's context
    for that agent. A file naming an agent (or another operator) as the proposer used to be taken at
    its word and went live; it is now refused, naming the line and field. The importer's own versions
    and the extractor's (which always wait for an operator) still import."""
    user = _user("procs")
    with memlane.Client(auto.target, token=_OPS_TOKEN, timeout=60) as ops:
        forged = _procedure("agent", "support-bot")
        with pytest.raises(memlane.InvalidArgumentError, match=r"line 2 \(procedure\): origin"):
            ops.import_user_data(data=_file(user, forged))
        with pytest.raises(memlane.InvalidArgumentError, match=r"line 2 \(procedure\): origin"):
            ops.import_user_data(data=_file(user, _procedure("operator", "someone-else")))
        owner = ppb.ProcedureOwner(agent_id="support-bot")
        assert ops.list_procedures(owner=owner).procedures == []  # nothing went live, nothing written
        # Controls: the extractor's version waits; the importer's own takes this sidecar's approval.
        extracted, own = _procedure("extractor", ""), _procedure("operator", "ops")
        receipt = ops.import_user_data(data=_file(user, extracted, own))
        assert receipt.imported["procedure"] == 2
        states = {p.procedure_id: p.versions[0].state for p in ops.list_procedures(owner=owner).procedures}
        assert states == {
            extracted["procedure_id"]: ppb.PROCEDURE_STATE_PROPOSED,
            own["procedure_id"]: ppb.PROCEDURE_STATE_ACTIVE,
        }
        # More versions of one procedure than it may hold: refused before the file's session is written.
        other, pid = _user("procs-many"), f"many-{uuid.uuid4().hex[:6]}"
        many = [
            _procedure("operator", "ops", procedure_id=pid, content=f"Step {i}: confirm the order number.")
            for i in range(101)
        ]
        with pytest.raises(memlane.ResourceExhaustedError, match="more than 100 versions"):
            ops.import_user_data(data=_file(other, _session(other, f"s-{other}"), *many))
        assert ops.list_users(query=other).users == []


def test_the_same_file_twice_writes_nothing_and_versions_keep_their_times(
    client: memlane.Client, start_server: ServerFactory
) -> None:
    """Versions older than the user's newest one here (an import merged into a user with history) used
    to be journaled at the import's time, so a second run found none of them and journaled them all
    again (18 -> 36). They now keep their own times, and a second run writes nothing."""
    user = _user("twice")
    caller = mpb.Caller(user_id=user)
    ids = [
        client.create_memory(
            caller=caller, content=f"Owns {n} bikes.", kind=mpb.MEMORY_KIND_FACT
        ).memory.memory_id
        for n in range(3)
    ]
    for mid in ids:
        client.update_memory(
            caller=caller,
            memory=mpb.Memory(memory_id=mid, content=f"Sold the bikes ({mid[:4]})."),
            update_mask=FieldMask(paths=["content"]),
        )
    data = b"".join(r.data for r in client.export_user_data(user_id=user))
    exported = sorted(
        r["changed_at_unix_ms"]
        for r in map(orjson.loads, data.splitlines())
        if r["record"] == "memory_version"
    )
    assert len(exported) == 6
    fresh = start_server()
    with memlane.Client(fresh.target, timeout=60) as other:
        other.create_memory(caller=caller, content="Moved to Porto.", kind=mpb.MEMORY_KIND_FACT)  # newer
        first = other.import_user_data(data=data, merge=True)
        assert first.imported["memory_version"] == 6 and first.imported["memory"] == 3
        versions = other.list_memory_versions(caller=caller, page_size=500).versions
        assert len(versions) == 7
        imported = sorted(v.changed_at_unix_ms for v in versions if v.memory_id in ids)
        assert imported == exported  # their own times, not the import's
        second = other.import_user_data(data=data, merge=True)
        assert dict(second.imported) == {} and second.skipped["memory_version"] == 6
        assert len(other.list_memory_versions(caller=caller, page_size=500).versions) == 7
        kept = {m.memory_id: m.created_at_unix_ms for m in client.list_memories(caller=caller).memories}
        moved = {m.memory_id: m.created_at_unix_ms for m in other.list_memories(caller=caller).memories}
        assert all(moved[i] == kept[i] for i in ids)  # every record keeps its own times


@pytest.mark.parametrize(
    ("case", "field"),
    [
        ("message token_count over the range", "token_count"),
        ("memory usage_count over the range", "usage_count"),
        ("session ttl_seconds over the range", "ttl_seconds"),
        ("version changed_at_ms over the range", "changed_at_ms"),
        ("session id with /", "session_id"),
        ("source_session_id with /", "source_session_id"),
        ("snapshot with a field more", "evil"),
        ("snapshot with a note of another type", "note"),
        ("second session over CreateSession's bounds", "channel"),
    ],
)
def test_a_bad_record_refuses_the_file_naming_line_and_field(
    client: memlane.Client, case: str, field: str
) -> None:
    """Out-of-range integers answered INTERNAL; a session id with ``/`` (archive files are named after
    it) was stored; a snapshot description with a field more was stored and then failed every snapshot
    call of the user (INTERNAL); a session over CreateSession's bounds was refused only after the
    sessions before it were written. Each is now INVALID_ARGUMENT naming the line and field, with
    nothing written; the control is the same file without the fault."""
    user = _user("bad")
    sid, now = f"s-{uuid.uuid4().hex[:8]}", int(time.time() * 1000)
    session, turn, memory = (
        _session(user, sid),
        _turn(sid, 1, "Hello."),
        _memory(user, f"{sid}-m", "Likes tea."),
    )
    version = {
        "record": "memory_version",
        "memory_id": f"{sid}-m",
        "reason": "create",
        "changed_by": "",
        "changed_at_ms": now,
        "deleted": False,
        "item": _doc(user, f"{sid}-m", "Likes tea.", now),
    }
    snapshot = {
        "record": "memory_snapshot",
        "snapshot_id": f"snap-{sid}",
        "user_id": user,
        "agent_id": "",
        "groups": [],
        "created_at_ms": now,
        "item_count": 1,
        "note": "",
        "items": [_doc(user, f"{sid}-m", "Likes tea.", now)],
    }
    second = _session(user, f"{sid}-2")
    good = [session, turn, memory, version, snapshot, second]
    faults: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "message token_count over the range": (turn, {"token_count": 2**64 - 1}),
        "memory usage_count over the range": (memory, {"usage_count": 2**63}),
        "session ttl_seconds over the range": (session, {"ttl_seconds": 2**63}),
        "version changed_at_ms over the range": (version, {"changed_at_ms": 2**63 - 1}),
        "session id with /": (second, {"session_id": "a/b"}),
        "source_session_id with /": (memory, {"source_session_id": "../x"}),
        "snapshot with a field more": (snapshot, {"evil": 1}),
        "snapshot with a note of another type": (snapshot, {"note": 7}),
        "second session over CreateSession's bounds": (second, {"channel": "c" * 2000}),
    }
    target, change = faults[case]
    records = [{**r, **change} if r is target else r for r in good]
    line = 2 + records.index({**target, **change})
    with pytest.raises(memlane.InvalidArgumentError, match=rf"line {line} \(\w+\): .*{field}") as refused:
        client.import_user_data(data=_file(user, *records))
    assert "internal" not in str(refused.value).lower()
    assert _nothing_of(client, user)
    caller = mpb.Caller(user_id=user)
    assert client.list_memory_snapshots(caller=caller).snapshots == []  # snapshot calls still answer
    # Control: the file without the fault imports, and its snapshot serves.
    receipt = client.import_user_data(data=_file(user, *good))
    assert receipt.imported["session"] == 2 and receipt.imported["memory_snapshot"] == 1
    assert [s.snapshot_id for s in client.list_memory_snapshots(caller=caller).snapshots] == [f"snap-{sid}"]
    client.forget_user(user_id=user)


def test_sequence_numbers_are_reconciled_and_duplicates_refused(client: memlane.Client) -> None:
    """A session whose ``last_seq`` was below its turns took the next append at a seq a turn already
    held (two turns at one seq); two memory records of one id left two rows with that id. The seq is
    now raised to the last turn, and an id (or a seq) twice in the file is refused."""
    user = _user("seqs")
    sid = f"s-{uuid.uuid4().hex[:8]}"
    turns = [_turn(sid, seq, f"Turn {seq}.") for seq in (1, 2, 3)]
    mem = _memory(user, f"{sid}-m", "Likes tea.")
    with pytest.raises(memlane.InvalidArgumentError, match=r"line 7 \(memory\): id .* appears twice"):
        client.import_user_data(
            data=_file(user, _session(user, sid), *turns, mem, {**mem, "content": "Likes coffee."})
        )
    with pytest.raises(
        memlane.InvalidArgumentError, match=r"line 6 \(message\): seq 2 appears twice in the session"
    ):
        client.import_user_data(
            data=_file(user, _session(user, sid), *turns, {**turns[1], "message_id": "other"})
        )
    with pytest.raises(
        memlane.InvalidArgumentError, match=r"line 6 \(message\): message_id .* appears twice in the session"
    ):
        client.import_user_data(data=_file(user, _session(user, sid), *turns, {**turns[1], "seq": 9}))
    with pytest.raises(
        memlane.InvalidArgumentError, match=r"line 3 \(session\): session_id .* appears twice"
    ):
        client.import_user_data(data=_file(user, _session(user, sid), _session(user, sid)))
    assert _nothing_of(client, user)
    # Control, and the reconciliation: last_seq 1 below three turns.
    receipt = client.import_user_data(
        data=_file(user, _session(user, sid, last_seq=1, message_count=1), *turns, mem)
    )
    assert receipt.imported["message"] == 3 and receipt.imported["memory"] == 1
    client.append_messages(session_id=sid, messages=[spb.Message(role=spb.ROLE_USER, content="Turn 4.")])
    seqs = [m.seq for m in client.list_messages(session_id=sid, page_size=10).messages]
    assert seqs == [1, 2, 3, 4]
    assert len(client.list_memories(caller=mpb.Caller(user_id=user)).memories) == 1
    client.forget_user(user_id=user)


def test_memory_ids_another_user_holds_are_refused_wherever_the_file_names_them(
    client: memlane.Client,
) -> None:
    """A snapshot or version in the file naming a memory id another user holds here used to be
    written (and a restore of that snapshot later wrote the item back under that id). Every memory id
    the file names is read against the memory table before anything is written."""
    owner, other = _user("holder"), _user("taker")
    held = client.create_memory(
        caller=mpb.Caller(user_id=owner), content="Owner's secret.", kind=mpb.MEMORY_KIND_FACT
    ).memory
    now = int(time.time() * 1000)
    snapshot = {
        "record": "memory_snapshot",
        "snapshot_id": "grab",
        "user_id": other,
        "agent_id": "",
        "groups": [],
        "created_at_ms": now,
        "item_count": 1,
        "note": "",
        "items": [_doc(other, held.memory_id, "Taker's text.", now)],
    }
    version = {
        "record": "memory_version",
        "memory_id": held.memory_id,
        "reason": "create",
        "changed_by": "",
        "changed_at_ms": now,
        "deleted": False,
        "item": _doc(other, held.memory_id, "Taker's text.", now),
    }
    for record in (snapshot, version):
        with pytest.raises(memlane.AlreadyExistsError, match=r"line 3: memory id .* taken by another user"):
            client.import_user_data(data=_file(other, _memory(other, f"own-{other}", "Mine."), record))
        assert _nothing_of(client, other)
    got = client.get_memory(caller=mpb.Caller(user_id=owner), memory_id=held.memory_id).memory
    assert got.content == "Owner's secret."
    # Control: the same records naming the importing user's own id import.
    own = f"own-{other}"
    mine = {**snapshot, "items": [_doc(other, own, "Mine.", now)]}
    receipt = client.import_user_data(data=_file(other, _memory(other, own, "Mine."), mine))
    assert receipt.imported["memory_snapshot"] == 1
    client.forget_user(user_id=other)
    client.forget_user(user_id=owner)


def test_snapshots_over_the_users_limit_refuse_the_file_before_any_write(start_server: ServerFactory) -> None:
    """A file with more snapshots than the user may hold was refused by the snapshot write, after its
    sessions and memories were written. The limit is now checked with the rest, before any write."""
    small = start_server(ltm_snapshots_max_per_user=1)
    user = _user("snaps")
    now = int(time.time() * 1000)
    snapshots = [
        {
            "record": "memory_snapshot",
            "snapshot_id": f"snap-{i}",
            "user_id": user,
            "agent_id": "",
            "groups": [],
            "created_at_ms": now + i,
            "item_count": 0,
            "note": "",
            "items": [],
        }
        for i in range(2)
    ]
    records = [_session(user, f"s-{user}"), _memory(user, f"m-{user}", "Likes tea.")]
    with memlane.Client(small.target, timeout=60) as c:
        with pytest.raises(memlane.ResourceExhaustedError, match="at most 1"):
            c.import_user_data(data=_file(user, *records, *snapshots))
        assert _nothing_of(c, user)
        receipt = c.import_user_data(data=_file(user, *records, snapshots[0]))  # control: within the limit
        assert receipt.imported["memory_snapshot"] == 1 and receipt.imported["session"] == 1


def test_parts_of_a_file_wait_under_the_users_keys(client: memlane.Client) -> None:
    """The parts of a file sent in parts write nothing until the last; a last part whose earlier ones
    are missing is refused, and erasing the user erases the parts held for it."""
    user = _user("parts")
    sid = f"s-{uuid.uuid4().hex[:8]}"
    head = _file(user).rstrip(b"\n")
    first = head + b"\n" + orjson.dumps(_session(user, sid)) + b"\n"
    rest = head + b"\n" + orjson.dumps(_turn(sid, 1, "One.")) + b"\n"
    upload = uuid.uuid4().hex
    held = client.import_user_data(data=first, upload_id=upload, part=0, more=True)
    assert held.user_id == user and dict(held.imported) == {}
    assert _nothing_of(client, user)  # held, not imported
    with pytest.raises(memlane.FailedPreconditionError, match="lacks part 0"):
        client.import_user_data(data=rest, upload_id=uuid.uuid4().hex, part=1)
    client.import_user_data(data=first, upload_id=upload, part=0, more=True)  # a retried part replaces itself
    done = client.import_user_data(data=rest, upload_id=upload, part=1)
    assert done.imported["session"] == 1 and done.imported["message"] == 1
    assert [m.content for m in client.list_messages(session_id=sid).messages] == ["One."]
    # Erasure reaches parts still held.
    client.forget_user(user_id=user)
    client.import_user_data(data=first, upload_id=upload, part=0, more=True)
    client.forget_user(user_id=user)
    with pytest.raises(memlane.FailedPreconditionError, match="lacks part 0"):
        client.import_user_data(data=rest, upload_id=upload, part=1)
    assert _nothing_of(client, user)
