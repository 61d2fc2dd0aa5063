"""LTM (LanceDB) and archives (Parquet) on S3-compatible object storage: a real S3 server over HTTP on
loopback (scripts/s3-server, moto's S3), found through the usual AWS environment variables."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow.parquet as pq

import memlane
from memlane import Message, Role, SessionStatus
from memlane.v1 import memory_pb2 as mpb
from memlane_server.infra.object_store import arrow_filesystem
from tests.conftest import ServerFactory, redis_client, wait_for
from tests.s3 import S3Server, s3

__all__ = ["s3"]  # the fixture, registered here by the import


def test_ltm_and_archive_round_trip_and_resume_on_s3(
    start_server: ServerFactory, s3: S3Server, redis_url: str, tmp_path: Path, user_id: str
) -> None:
    base = uuid.uuid4().hex[:10]
    mark = f"Quokka{uuid.uuid4().hex[:8]}"
    policies = tmp_path / "p.yaml"
    policies.write_text("channels:\n  chat: {kind: messaging, hot_retention: 0, resume_turns: 3}\n")
    data = tmp_path / "data"
    srv = start_server(
        data_dir=str(data),
        ltm_uri=s3.uri(base, "ltm"),
        archive_uri=s3.uri(base, "archive"),
        channel_policies_file=str(policies),
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

    # It all lives in the bucket, nothing under the data directory.
    assert s3.holders(f"{base}/ltm/memories.lance/data/", mark.encode())
    assert s3.keys(f"{base}/ltm/memories.lance/_versions/")
    assert [k for k in s3.keys(f"{base}/archive/") if k.endswith(".parquet")] == [
        f"{base}/archive/{d}/{uri.split('/transcripts/', 1)[1]}"
        for d in ("summaries", "traces", "transcripts")
    ]
    assert not (data / "ltm").exists() and not (data / "archive").exists()
