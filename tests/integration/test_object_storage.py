"""LTM (LanceDB) and archives (Parquet) on S3-compatible object storage: a real S3 server over HTTP on
loopback (scripts/s3-server, moto's S3), found through the usual AWS environment variables."""

from __future__ import annotations

import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import lancedb
import pyarrow.parquet as pq
import pytest

import memlane
from memlane import Message, Role, SessionStatus
from memlane.v1 import memory_pb2 as mpb
from memlane_server.errors import Unavailable
from memlane_server.infra.endpoints import arrow_filesystem, lance_storage_options
from memlane_server.ltm import LanceMemoryStore, MemoryItem, MemoryKind, MemoryScope, filters
from tests.conftest import ServerFactory, redis_client, wait_for
from tests.s3 import S3Server, s3

__all__ = ["s3"]  # the fixture, registered here by the import


def test_ltm_and_archive_round_trip_and_resume_on_s3(
    start_server: ServerFactory, s3: S3Server, redis_url: str, tmp_path: Path, user_id: str
) -> None:
    base = uuid.uuid4().hex[:10]
    mark = f"Quokka{uuid.uuid4().hex[:8]}"
    policies = tmp_path / "p.yaml"
    policies.write_text(
        "channels:\n  chat: {kind: messaging, hot_retention: 0, resume_turns: 3}\n"
        "  brief: {archive_retention: 1s}\n"
    )
    data = tmp_path / "data"
    srv = start_server(
        data_dir=str(data),
        ltm_uri=s3.uri(base, "ltm"),
        archive_uri=s3.uri(base, "archive"),
        channel_policies_file=str(policies),
        archive_retention_interval_seconds=0.3,
    )
    who = mpb.Caller(user_id=user_id)
    with memlane.Client(srv.target, timeout=60) as c:
        made = c.create_memory(caller=who, kind=mpb.MEMORY_KIND_FACT, content=f"User's boat is {mark}.")
        hits = c.search_memories(caller=who, query=f"boat {mark}", limit=5).results
        assert made.memory.memory_id in [h.memory.memory_id for h in hits]

        sid = c.create_session(user_id=user_id, channel="chat").session.session_id
        said = [f"Plan {i}: {mark} sails at dawn." for i in range(6)]
        c.append_messages(
            session_id=sid,
            messages=[
                Message(role=Role.ROLE_USER if i % 2 == 0 else Role.ROLE_ASSISTANT, content=t)
                for i, t in enumerate(said)
            ],
        )
        [uri] = c.promote_session(session_id=sid, close=True).archive_uris
        assert uri.startswith(s3.uri(base, "archive", "transcripts", "date="))
        fs, path = arrow_filesystem(uri)
        rows = sorted(pq.read_table(path, filesystem=fs).to_pylist(), key=lambda r: r["seq"])
        assert [r["content"] for r in rows] == said

        # Hot retention 0: retired once archived, then reloaded from S3 when asked for.
        r = redis_client(redis_url)
        keys = srv.sidecar.keys
        wait_for(lambda: not r.exists(keys.session(sid).messages), timeout=30)
        r.close()
        resumed = c.get_session(session_id=sid).session
        assert resumed.status == SessionStatus.SESSION_STATUS_ACTIVE
        assert [m.content for m in c.list_messages(session_id=sid).messages] == said[-3:]

        # Retention deletes a short-lived channel's parts from the bucket, and only those.
        brief = c.create_session(user_id=user_id, channel="brief").session.session_id
        c.append_messages(session_id=brief, messages=[Message(role=Role.ROLE_USER, content="Short-lived.")])
        assert c.promote_session(session_id=brief, close=True).archive_uris
        assert [k for k in s3.keys(f"{base}/archive/") if "channel=brief/" in k and k.endswith(".parquet")]
        wait_for(
            lambda: (
                not [
                    k for k in s3.keys(f"{base}/archive/") if "channel=brief/" in k and k.endswith(".parquet")
                ]
            ),
            timeout=15,
        )

    # It all lives in the bucket, nothing under the data directory.
    assert s3.holders(f"{base}/ltm/memories.lance/data/", mark.encode())
    assert s3.keys(f"{base}/ltm/memories.lance/_versions/")
    assert [k for k in s3.keys(f"{base}/archive/") if k.endswith(".parquet")] == [
        f"{base}/archive/{d}/{uri.split('/transcripts/', 1)[1]}"
        for d in ("summaries", "traces", "transcripts")
    ]
    assert not (data / "ltm").exists() and not (data / "archive").exists()


def _ids(c: memlane.Client, user: str) -> set[str]:
    return {m.memory_id for m in c.list_memories(caller=mpb.Caller(user_id=user), page_size=500).memories}


def test_two_sidecars_share_one_ltm_table_on_s3(start_server: ServerFactory, s3: S3Server) -> None:
    """Both write at once while both compact every second; one erases a user mid-way. No acknowledged
    write is lost, each sees the other's, and the one that did not erase reads on (its handle's version
    was cleaned up under it by the other's erasure)."""
    tag = uuid.uuid4().hex[:8]
    shared = {
        "key_prefix": f"t{uuid.uuid4().hex[:10]}",  # one Redis namespace: the table lock, LTM versions
        "ltm_uri": s3.uri(tag, "ltm"),
        "archive_uri": s3.uri(tag, "archive"),
        "ltm_optimize_interval_seconds": 1.0,
        "ltm_optimize_after_writes": 2,
    }
    a, b = start_server(**shared), start_server(**shared)
    users = [f"u{i}-{tag}" for i in range(3)]
    victim, mark = f"victim-{tag}", f"Wombat{uuid.uuid4().hex[:8]}"
    with memlane.Client(a.target, timeout=120) as ca, memlane.Client(b.target, timeout=120) as cb:
        for i in range(3):
            ca.create_memory(
                caller=mpb.Caller(user_id=victim), kind=mpb.MEMORY_KIND_FACT, content=f"{mark} fact {i}."
            )
        acked: dict[str, set[str]] = {u: set() for u in users}
        lock = threading.Lock()

        def write(c: memlane.Client, name: str, n: int) -> None:
            for i in range(n):
                user = users[i % len(users)]
                made = c.create_memory(
                    caller=mpb.Caller(user_id=user),
                    kind=mpb.MEMORY_KIND_FACT,
                    content=f"Fact {i} from {name} about topic {uuid.uuid4().hex[:6]}.",
                )
                with lock:
                    acked[user].add(made.memory.memory_id)

        with ThreadPoolExecutor(4) as pool:
            writers = [pool.submit(write, c, f"w{k}", 12) for k, c in enumerate((ca, ca, cb, cb))]
            erased = pool.submit(cb.forget_user, user_id=victim)
            for f in writers:
                f.result()
            assert erased.result().erased["lancedb.items"] == 3

        # Each sees every acknowledged write, the other's too, within ltm_read_consistency_seconds.
        def converged() -> bool:
            return all(_ids(c, u) == acked[u] for c in (ca, cb) for u in users)

        wait_for(converged, timeout=10)
        assert not _ids(ca, victim)

    assert s3.holders(f"{tag}/ltm/", mark.encode()) == []


def _fragments(uri: str) -> int:
    """Fragments of the latest version, read by a handle of the test's own."""
    table = lancedb.connect(uri, storage_options=lance_storage_options(uri)).open_table("memories")
    stats: Any = table.stats()  # annotated as a class, a dict at run time (lancedb 0.40)
    return int(stats["fragment_stats"]["num_fragments"])


def test_a_reader_on_a_cleaned_up_version_reads_on(start_server: ServerFactory, s3: S3Server) -> None:
    """A's handle stays on the version it wrote (no periodic checks: the widest staleness window; A has
    read the user since its write, so the user's version token, unchanged by B's writes of another
    user, asks for no refresh either). B compacts A's row and its own into one fragment, then erases its
    user: that rewrites the fragment and deletes every older version's files, those A reads among them.
    A's next search finds them gone and re-reads the latest."""
    tag = uuid.uuid4().hex[:8]
    uri = s3.uri(tag, "ltm")
    shared = {"key_prefix": f"t{uuid.uuid4().hex[:10]}", "ltm_uri": uri}
    # The table read path itself: no in-memory recall entry between A's searches and the table.
    a = start_server(**shared, ltm_read_consistency_seconds=-1, ltm_hot_index_mb=0)
    b = start_server(**shared, ltm_optimize_interval_seconds=0.2, ltm_optimize_after_writes=1)
    reader, doomed = mpb.Caller(user_id=f"reader-{tag}"), mpb.Caller(user_id=f"doomed-{tag}")
    with memlane.Client(a.target, timeout=60) as ca, memlane.Client(b.target, timeout=60) as cb:
        made = ca.create_memory(caller=reader, kind=mpb.MEMORY_KIND_FACT, content="User grows basil.")
        assert ca.search_memories(caller=reader, query="basil").results  # A's view is current with it
        cb.create_memory(caller=doomed, kind=mpb.MEMORY_KIND_FACT, content="User grows thyme.")
        wait_for(lambda: _fragments(uri) == 1, timeout=30)
        assert a.sidecar.ltm is not None and a.sidecar.ltm.store.contention.stale_reads_retried == 0
        assert cb.forget_user(user_id=doomed.user_id).erased["lancedb.items"] == 1
        hits = ca.search_memories(caller=reader, query="basil").results
        assert [h.memory.memory_id for h in hits] == [made.memory.memory_id]
        assert a.sidecar.ltm.store.contention.stale_reads_retried >= 1


def test_forget_user_leaves_no_byte_in_the_bucket(start_server: ServerFactory, s3: S3Server) -> None:
    """ForgetUser on S3: every object under the sidecar's prefixes (LTM data, indexes, old versions,
    manifests, transaction files; archive parts) is read raw and holds neither the user's content, nor
    their id, nor the id's digest that LanceDB predicates use."""
    tag = uuid.uuid4().hex[:8]
    srv = start_server(ltm_uri=s3.uri(tag, "ltm"), archive_uri=s3.uri(tag, "archive"))
    a, b = f"erin{uuid.uuid4().hex[:10]}", f"fred{uuid.uuid4().hex[:10]}"
    mark_a, mark_b = f"axolotl{uuid.uuid4().hex[:10]}", f"pangolin{uuid.uuid4().hex[:10]}"
    with memlane.Client(srv.target, timeout=120) as c:
        for user, mark in ((a, mark_a), (b, mark_b)):
            sid = c.create_session(user_id=user, channel="web").session.session_id
            c.append_messages(
                session_id=sid,
                messages=[Message(role=Role.ROLE_USER, content=f"My codename is {mark}. I live in Porto.")],
            )
            c.create_memory(
                caller=mpb.Caller(user_id=user), kind=mpb.MEMORY_KIND_FACT, content=f"Codename is {mark}."
            )
            c.promote_session(session_id=sid, close=True, timeout=120)
        needles = (mark_a.encode(), a.encode(), filters.key(a).encode())
        # Positive controls: each needle is in the bucket, raw, before erasure; the archive too.
        for needle in needles:
            assert s3.holders(f"{tag}/ltm/", needle), needle
        assert s3.holders(f"{tag}/archive/", a.encode())

        receipt = c.forget_user(user_id=a)
        assert receipt.erased["lancedb.items"] >= 2 and receipt.erased["archive.files"] >= 3

        for needle in needles:
            assert s3.holders(f"{tag}/", needle) == [], needle
        # The other user is untouched.
        assert s3.holders(f"{tag}/ltm/", mark_b.encode()) and s3.holders(f"{tag}/archive/", b.encode())
        hits = c.search_memories(caller=mpb.Caller(user_id=b), query=f"codename {mark_b}").results
        assert any(mark_b in h.memory.content for h in hits)


async def test_an_unreachable_object_store_answers_unavailable(tmp_path: Path) -> None:
    """The store stops answering (a chaos pause, an outage): reads and writes fail as UNAVAILABLE, which
    clients retry, not INTERNAL."""
    server = S3Server(tmp_path)
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    try:
        uri = server.uri(uuid.uuid4().hex[:8], "ltm")
        store = await LanceMemoryStore.open(uri, 384)
        victim = MemoryItem(
            id="m1",
            user_id="u",
            agent_id="a",
            scope=MemoryScope.USER,
            kind=MemoryKind.FACT,
            content="x",
            vector=[0.1] * 384,
        )
        await store.add([victim])  # positive control: it answers while up
        server.stop()
        with pytest.raises(Unavailable):
            await store.fetch(filters.owned_by("u"))
        with pytest.raises(Unavailable):
            await store.add([victim])
        store.close()
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
