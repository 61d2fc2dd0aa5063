"""Per-user export and erasure: ForgetUser leaves no byte of the user's content or id in any file under
the data directory (the embedded Redis's append-only file, LanceDB data, indexes, versions and
transaction files, the archive), and leaves other users alone."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from google.protobuf.field_mask_pb2 import FieldMask

import memlane
from memlane import Message, Role
from memlane.v1 import admin_pb2, memory_pb2, procedure_pb2
from memlane.v1 import checkpoint_pb2 as kpb
from memlane_server.background import SidecarThread
from memlane_server.infra.redis_server import server_binary
from memlane_server.keyspace import KeySpace
from memlane_server.ltm import filters
from tests.conftest import ServerFactory, raw, redis_client, stream_entries, wait_for


def _redis_bytes(url: str, prefix: str) -> bytes:
    """Every key and value under the prefix, read by type (DUMP would hide text behind compression)."""
    r = redis_client(url)
    out = bytearray()
    for key in r.scan_iter(match=KeySpace(prefix).pattern(), count=1000):
        out += raw(key)
        kind = r.type(key)
        if kind == b"string":
            out += raw(r.get(key) or b"")
        elif kind == b"hash":
            for k, v in r.hgetall(key).items():
                out += raw(k) + raw(v)
        elif kind == b"zset":
            for m in r.zrange(key, 0, -1):
                out += raw(m)
        elif kind == b"set":
            for m in r.smembers(key):
                out += raw(m)
        elif kind == b"list":
            for m in r.lrange(key, 0, -1):
                out += raw(m)
        elif kind == b"stream":
            for fields in stream_entries(r, key):
                for k, v in fields.items():
                    out += k + v
    r.close()
    return bytes(out)


def _disk_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def _files_holding(root: Path, needle: bytes) -> list[str]:
    return [
        str(p.relative_to(root)) for p in sorted(root.rglob("*")) if p.is_file() and needle in p.read_bytes()
    ]


def _archive_text(root: Path) -> str:
    """Parquet pages are compressed; read the rows back as text."""
    return "".join(json.dumps(pq.read_table(p).to_pylist(), default=str) for p in root.rglob("*.parquet"))


def _fill(c: memlane.Client, user: str, marker: str) -> str:
    sid = c.create_session(user_id=user, channel="web").session.session_id
    c.append_messages(
        session_id=sid,
        messages=[
            Message(role=Role.ROLE_USER, content=f"My project codename is {marker}. I live in Lisbon."),
            Message(role=Role.ROLE_ASSISTANT, content=f"Noted, {marker} it is."),
        ],
    )
    c.create_memory(
        caller=memory_pb2.Caller(user_id=user),
        content=f"The user's codename is {marker}.",
        kind=memory_pb2.MEMORY_KIND_FACT,
    )
    list(c.assemble_context(session_id=sid, user_input=f"what is {marker}?"))  # leaves a turn trace
    c.promote_session(session_id=sid, close=True, timeout=120)
    return sid


@pytest.fixture(scope="module")
def sidecar(start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> SidecarThread:
    return start_server(data_dir=str(tmp_path_factory.mktemp("erasure")))


def test_forget_user_erases_everywhere(sidecar: SidecarThread, redis_url: str) -> None:
    a, b = f"alice-{uuid.uuid4().hex[:6]}", f"bob-{uuid.uuid4().hex[:6]}"
    mark_a, mark_b = f"zebrafish{uuid.uuid4().hex[:10]}", f"kingfisher{uuid.uuid4().hex[:10]}"
    data = Path(sidecar.settings.server.data_dir)
    prefix = sidecar.settings.redis.key_prefix
    with memlane.Client(sidecar.target, timeout=60) as c:
        sid_a = _fill(c, a, mark_a)
        _fill(c, b, mark_b)
        # Positive controls: the marker is really there, in every store, before erasure.
        assert mark_a.encode() in _redis_bytes(redis_url, prefix)
        assert mark_a.encode() in _disk_bytes(data / "ltm")
        assert mark_a in _archive_text(data / "archive")

        exported = b"".join(r.data for r in c.export_user_data(user_id=a))
        kinds = {r.kind for r in c.export_user_data(user_id=a)}
        assert mark_a.encode() in exported and mark_b.encode() not in exported
        assert {"session", "message", "trace", "memory", "archive.transcripts"} <= kinds
        parquet = list(c.export_user_data(user_id=a, format=admin_pb2.EXPORT_FORMAT_PARQUET))
        assert {r.kind for r in parquet} == kinds and all(
            r.data[:4] == b"PAR1" for r in parquet if r.part == 0
        )

        receipt = c.forget_user(user_id=a)
        assert receipt.erased["redis.sessions"] == 1 and receipt.erased["redis.messages"] >= 0
        assert receipt.erased["lancedb.items"] >= 2 and receipt.erased["archive.files"] >= 2

        raw_redis = _redis_bytes(redis_url, prefix)
        assert mark_a.encode() not in raw_redis and a.encode() not in raw_redis
        assert mark_a.encode() not in _disk_bytes(data / "ltm"), "an old LanceDB version still holds the user"
        assert mark_a not in _archive_text(data / "archive") and mark_a.encode() not in _disk_bytes(
            data / "archive"
        )
        with pytest.raises(memlane.NotFoundError):
            c.get_session(session_id=sid_a)
        assert list(c.search_memories(caller=memory_pb2.Caller(user_id=a), query=mark_a).results) == []

        again = c.forget_user(user_id=a)  # idempotent
        assert all(v == 0 for v in again.erased.values())

        # The other user is untouched.
        assert mark_b.encode() in _redis_bytes(redis_url, prefix)
        hits = c.search_memories(caller=memory_pb2.Caller(user_id=b), query=f"codename {mark_b}").results
        assert any(mark_b in h.memory.content for h in hits)
        assert mark_b in _archive_text(data / "archive")


def test_forget_user_leaves_no_byte_under_the_data_dir(start_server: ServerFactory, tmp_path: Path) -> None:
    """Embedded Redis (no redis_url): its append-only file lives under the data dir and must be
    rewritten. Every file is scanned raw, the user's id as well as their content."""
    data = tmp_path / "data"
    sidecar = start_server(redis_url="", data_dir=str(data))
    a, b = f"erin{uuid.uuid4().hex[:10]}", f"fred{uuid.uuid4().hex[:10]}"
    mark_a, mark_b = f"axolotl{uuid.uuid4().hex[:10]}", f"pangolin{uuid.uuid4().hex[:10]}"
    with memlane.Client(sidecar.target, timeout=120) as c:
        sid_a = _fill(c, a, mark_a)
        _fill(c, b, mark_b)
        kite = c.create_memory(  # one more item, in a fragment of its own, after the other user's
            caller=memory_pb2.Caller(user_id=a),
            content=f"User {a} owns a {mark_a} kite.",
            kind=memory_pb2.MEMORY_KIND_FACT,
        ).memory
        # Versions, a snapshot and a procedure learned from the user's session hold the user too.
        c.create_memory_snapshot(caller=memory_pb2.Caller(user_id=a), snapshot_id=f"snap-{mark_a}")
        kite.content = f"User {a} owns a blue {mark_a} kite."
        c.update_memory(
            caller=memory_pb2.Caller(user_id=a), memory=kite, update_mask=FieldMask(paths=["content"])
        )
        c.propose_procedure(
            procedure_id=f"ask-{mark_a}",
            kind=procedure_pb2.PROCEDURE_KIND_ROUTINE,
            content=f"Ask about {mark_a} first.",
            source_session_id=sid_a,
        )
        kinds = {r.kind for r in c.export_user_data(user_id=a)}
        assert {"memory_version", "memory_snapshot", "procedure"} <= kinds
        # Positive controls: before erasure the user has turn traces (the marker was injected into a
        # prompt), and the id and the marker are on disk, the AOF among them.
        traces = [r.data for r in c.export_user_data(user_id=a) if r.kind == "trace"]
        assert traces and mark_a.encode() in b"".join(traces)
        for needle in (a.encode(), mark_a.encode()):
            holders = _files_holding(data, needle)
            assert any(h.startswith("redis/") for h in holders), holders
            assert any(h.startswith("ltm/") for h in holders), holders

        receipt = c.forget_user(user_id=a)
        assert list(receipt.rewritten) == ["redis.aof"] and list(receipt.operator_actions) == []
        assert receipt.erased["lancedb.items"] >= 3
        assert receipt.erased["redis.memory_versions"] >= 3 and receipt.erased["redis.memory_snapshots"] == 1
        assert receipt.erased["redis.procedure_versions"] == 1

        # Not even the digest LanceDB predicates use (old versions and transaction files are gone).
        for needle in (a.encode(), mark_a.encode(), filters.key(a).encode()):
            assert _files_holding(data, needle) == [], needle
        assert mark_a not in _archive_text(data / "archive")
        # The other user is untouched, on disk and through the API.
        assert any(h.startswith("redis/") for h in _files_holding(data, mark_b.encode()))
        hits = c.search_memories(caller=memory_pb2.Caller(user_id=b), query=f"codename {mark_b}").results
        assert any(mark_b in h.memory.content for h in hits)
        assert mark_b in _archive_text(data / "archive")
        exported = list(c.export_user_data(user_id=b))
        assert mark_b.encode() in b"".join(r.data for r in exported)
        assert {"trace", "memory", "message"} <= {r.kind for r in exported}


def test_only_admins_erase(start_server: ServerFactory, tmp_path: Path) -> None:
    import yaml  # noqa: PLC0415

    policy = tmp_path / "policy.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "tokens": [
                    {"token": "op", "agent": "operator"},
                    {"token": "bot", "agent": "bot"},
                    {"token": "aud", "agent": "auditor"},
                ],
                "agents": {"operator": {"roles": ["admin"]}, "auditor": {"roles": ["auditor"]}},
            }
        )
    )
    secured = start_server(auth_required=True, access_policy_file=str(policy))
    with memlane.Client(secured.target, token="bot") as bot:
        with pytest.raises(memlane.PermissionDeniedError, match="admin role"):
            bot.forget_user(user_id="someone")
        with pytest.raises(memlane.PermissionDeniedError, match="admin role"):
            list(bot.export_user_data(user_id="someone"))
    with memlane.Client(secured.target, token="aud") as auditor:
        assert list(auditor.export_user_data(user_id="someone")) == []
        with pytest.raises(memlane.PermissionDeniedError):
            auditor.forget_user(user_id="someone")
    with memlane.Client(secured.target, token="op") as op:
        assert dict(op.forget_user(user_id="someone").erased)["redis.sessions"] == 0


@pytest.fixture()
def external_redis(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Starts redis-server processes configured as an operator's Redis might be; yields a factory."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> str:
        d = tmp_path / f"redis{len(procs)}"
        d.mkdir()
        sock = d / "redis.sock"
        cmd = [server_binary(), "--port", "0", "--unixsocket", str(sock), "--dir", str(d), *args]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_for(sock.exists)
        return f"unix://{sock}"

    yield start
    for p in procs:
        p.terminate()
        p.wait(10)


def test_external_redis_rewrites_where_permitted_and_says_what_is_left(
    start_server: ServerFactory, external_redis: Callable[..., str], tmp_path: Path
) -> None:
    refusing = external_redis("--appendonly", "yes", "--save", "", "--rename-command", "BGREWRITEAOF", "")
    permitting = external_redis("--appendonly", "yes", "--save", "3600", "1", "--aof-use-rdb-preamble", "no")
    for url, rewritten, action in [
        (refusing, [], "BGREWRITEAOF did not complete"),
        (permitting, ["redis.aof", "redis.rdb"], "snapshots"),
    ]:
        sidecar = start_server(redis_url=url, data_dir=str(tmp_path / f"d{len(rewritten)}"))
        with memlane.Client(sidecar.target, timeout=60) as c:
            user = f"gina{uuid.uuid4().hex[:8]}"
            c.create_session(user_id=user)
            receipt = c.forget_user(user_id=user)
            assert receipt.erased["redis.sessions"] == 1
            assert list(receipt.rewritten) == rewritten, receipt.operator_actions
            assert any(action in a for a in receipt.operator_actions), receipt.operator_actions


def test_a_user_id_with_glob_characters_erases_only_that_user(sidecar: SidecarThread, redis_url: str) -> None:
    """Per-user keys are found by SCAN: the id's ``*`` must not match another user's keys."""
    tag = uuid.uuid4().hex[:6]
    glob_user, other = f"g{tag}*", f"g{tag}-other"
    with memlane.Client(sidecar.target) as c:
        for user in (glob_user, other):
            mid = c.create_memory(
                caller=memory_pb2.Caller(user_id=user), kind=memory_pb2.MEMORY_KIND_FACT, content="Likes tea."
            ).memory.memory_id
            c.record_feedback(
                caller=memory_pb2.Caller(user_id=user),
                memory_id=mid,
                verdict=memory_pb2.FEEDBACK_VERDICT_USEFUL,
            )
        r = redis_client(redis_url)
        prefix = sidecar.settings.redis.key_prefix
        others = sorted(r.scan_iter(match=KeySpace(prefix).user_pattern(other)))
        assert len(others) >= 2  # positive control: the other user's LTM version and once-mark exist
        receipt = c.forget_user(user_id=glob_user)
        assert receipt.erased["redis.once_marks"] == 1
        assert sorted(r.scan_iter(match=KeySpace(prefix).user_pattern(other))) == others
        assert [m.content for m in c.get_profile(caller=memory_pb2.Caller(user_id=other)).facts] == [
            "Likes tea."
        ]
        r.close()


def test_forget_user_leaves_no_key_of_the_users_sessions(sidecar: SidecarThread, redis_url: str) -> None:
    """Found by key names, not from the key layout: every kind of per-session key a session can have
    (messages, a removal's answer, an edit, checkpoints, traces, the end pipeline's state) is made first,
    so leaving one kind out of the erasure fails here."""
    user = f"carol-{uuid.uuid4().hex[:6]}"
    prefix = sidecar.settings.redis.key_prefix
    r = redis_client(redis_url)
    with memlane.Client(sidecar.target, timeout=60) as c:
        sid = c.create_session(user_id=user).session.session_id
        out = c.append_messages(
            session_id=sid,
            messages=[
                Message(role=Role.ROLE_USER, content=f"note {i}: the gate code is 40{i}") for i in range(4)
            ],
        )
        ids = [m.message_id for m in out.results]
        c.remove_messages(session_id=sid, message_ids=ids[:1])  # the removal's answer, kept for retries
        c.update_message(
            message=Message(message_id=ids[1], content="note 1: redacted"),
            session_id=sid,
            update_mask=FieldMask(paths=["content"]),
        )
        c.put_checkpoint(
            session_id=sid, checkpoint_id="ck-1", checkpoint=kpb.TypedValue(type="json", data=b"{}")
        )
        list(c.assemble_context(session_id=sid, user_input="which gate code?"))  # a turn trace
        ended = c.create_session(user_id=user).session.session_id
        c.append_messages(session_id=ended, messages=[Message(role=Role.ROLE_USER, content="I like tea")])
        c.promote_session(session_id=ended, close=True, timeout=120)  # pipeline state, promoted ids

        def keys_of(s: str) -> list[bytes]:
            return sorted(
                raw(k) for k in r.scan_iter(match=f"{prefix}:*", count=1000) if s.encode() in raw(k)
            )

        made = keys_of(sid) + keys_of(ended)
        # Positive control: the kinds this test is about exist before the erasure.
        for kind in (b":removals", b":msgs", b":pipeline"):
            assert any(kind in k for k in made), (kind, made)
        c.forget_user(user_id=user)
        assert keys_of(sid) == [] and keys_of(ended) == [], keys_of(sid) + keys_of(ended)
    r.close()
