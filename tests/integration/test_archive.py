"""Cold storage: Parquet archives read back with pyarrow, retention, retirement and resumption."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.dataset as ds

import memlane
from memlane import Message, NativeMessage, PromotionState, Role, SessionStatus
from memlane.v1 import session_service_pb2 as spb
from tests.conftest import ServerFactory, hget, redis_client, session_events, wait_for

EV = spb.SessionEventType


def test_archive_parquet_equals_the_transcript(
    start_server: ServerFactory, tmp_path: Path, user_id: str
) -> None:
    archive = tmp_path / "cold"
    srv = start_server(ltm_enabled=False, archive_uri=f"file://{archive}")
    with memlane.Client(srv.target, timeout=20) as c:
        sid = c.create_session(user_id=user_id, channel="web/eu", agent_id="planner").session.session_id
        native = json.dumps({"type": "human", "data": {"content": "Book a table"}})
        c.append_messages(
            session_id=sid,
            messages=[
                Message(
                    role=Role.ROLE_USER,
                    content="Book a table for 4 at 8pm",
                    participant_name="ana",
                    native=NativeMessage(format="langchain", json=native),
                    metadata={"lang": "en"},
                ),
                Message(
                    role=Role.ROLE_ASSISTANT,
                    content="Done: table for 4 at 20:00.",
                    source_agent_id="planner",
                    tool_call_ids=["call_1"],
                    planning_steps=["find venue", "book"],
                    invoked=["booking"],
                ),
                Message(role=Role.ROLE_TOOL, content='{"ok": true}', tool_call_ids=["call_1"]),
                Message(role=Role.ROLE_USER, content="draft: maybe 9pm?", transient=True),
                Message(
                    role=Role.ROLE_USER, content="Thanks — see you", created_at_unix_ms=1_700_000_000_123
                ),
            ],
        )
        transcript = [m for m in c.list_messages(session_id=sid, page_size=100).messages if not m.transient]
        out = c.promote_session(session_id=sid, close=True)
    [uri] = out.archive_uris
    assert uri.startswith(str(archive)) and "/channel=web%2Feu/" in uri and "/date=" in uri

    table = ds.dataset(str(archive / "transcripts"), format="parquet", partitioning="hive").to_table(
        filter=ds.field("session_id") == sid
    )
    rows = sorted(table.to_pylist(), key=lambda r: r["seq"])
    assert [r["message_id"] for r in rows] == [m.message_id for m in transcript]
    assert [r["content"] for r in rows] == [m.content for m in transcript]
    assert [r["seq"] for r in rows] == [m.seq for m in transcript]
    assert [r["role"] for r in rows] == ["user", "assistant", "tool", "user"]
    assert [int(r["created_at"].timestamp() * 1000) for r in rows] == [
        m.created_at_unix_ms for m in transcript
    ]
    assert [r["token_count"] for r in rows] == [m.token_count for m in transcript]
    assert rows[0]["participant_name"] == "ana" and dict(rows[0]["metadata"]) == {"lang": "en"}
    assert rows[0]["native_format"] == "langchain" and json.loads(rows[0]["native_json"]) == json.loads(
        native
    )
    assert rows[1]["planning_steps"] == ["find venue", "book"] and rows[1]["invoked"] == ["booking"]
    assert rows[2]["tool_call_ids"] == ["call_1"]
    assert {r["channel"] for r in rows} == {"web/eu"}  # the partition column, decoded

    summary = (
        ds.dataset(str(archive / "summaries"), format="parquet", partitioning="hive").to_table().to_pylist()
    )
    [srow] = [r for r in summary if r["session_id"] == sid]
    assert srow["summary"] == out.session.summary.text and srow["status"] == "closed"
    assert srow["first_seq"] == 1 and srow["last_seq"] == 5 and srow["agent_id"] == "planner"


def test_retention_deletes_old_archives(start_server: ServerFactory, tmp_path: Path, user_id: str) -> None:
    policies = tmp_path / "p.yaml"
    policies.write_text("channels:\n  brief: {archive_retention: 1s}\n  kept: {archive_retention: 30d}\n")
    srv = start_server(
        ltm_enabled=False, channel_policies_file=str(policies), archive_retention_interval_seconds=0.3
    )
    with memlane.Client(srv.target, timeout=20) as c:
        uris = {}
        for channel in ("brief", "kept"):
            sid = c.create_session(user_id=user_id, channel=channel).session.session_id
            c.append_messages(
                session_id=sid, messages=[Message(role=Role.ROLE_USER, content=f"in {channel}")]
            )
            [uris[channel]] = c.promote_session(session_id=sid, close=True).archive_uris
    assert Path(uris["brief"]).exists() and Path(uris["kept"]).exists()
    wait_for(lambda: not Path(uris["brief"]).exists(), timeout=5)
    assert Path(uris["kept"]).exists()
    for dataset in ("summaries", "traces"):
        assert not Path(uris["brief"].replace("/transcripts/", f"/{dataset}/")).exists()
        assert Path(uris["kept"].replace("/transcripts/", f"/{dataset}/")).exists()


def test_retired_thread_resumes_from_the_archive(
    start_server: ServerFactory, redis_url: str, tmp_path: Path, user_id: str
) -> None:
    policies = tmp_path / "p.yaml"
    policies.write_text("channels:\n  chat: {kind: messaging, hot_retention: 0, resume_turns: 3}\n")
    srv = start_server(ltm_enabled=False, channel_policies_file=str(policies))
    keys = srv.sidecar.keys
    r = redis_client(redis_url)
    with memlane.Client(srv.target, timeout=20) as c:
        sid = c.create_session(user_id=user_id, channel="chat").session.session_id
        c.append_messages(
            session_id=sid,
            messages=[
                Message(
                    role=Role.ROLE_USER if i % 2 == 0 else Role.ROLE_ASSISTANT,
                    content=f"We decided to use plan {i}.",
                )
                for i in range(8)
            ],
        )
        c.close_session(session_id=sid)
        # Hot retention 0: retired right after archiving; only the stub stays in Redis.
        wait_for(lambda: hget(r, keys.session(sid).doc, "retired_at_ms"))
        assert not r.exists(keys.session(sid).messages) and not r.exists(keys.session(sid).order)
        stub_archives = json.loads(hget(r, keys.session(sid).doc, "archives") or b"[]")
        assert stub_archives[0]["transcript"].endswith(".parquet")

        resumed = c.get_session(session_id=sid).session  # transparently reloaded
        assert resumed.status == SessionStatus.SESSION_STATUS_ACTIVE
        assert resumed.promotion_state == PromotionState.PROMOTION_STATE_NONE
        assert resumed.summary.through_seq == 8 and "plan" in resumed.summary.text
        msgs = c.list_messages(session_id=sid).messages
        assert [m.seq for m in msgs] == [6, 7, 8]
        assert [m.content for m in msgs] == [f"We decided to use plan {i}." for i in (5, 6, 7)]
        assert r.pttl(keys.session(sid).alive) > 0

        more = c.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="One more.")])
        assert more.results[0].seq == 9
        second = c.promote_session(session_id=sid, close=True)
        assert len(second.archive_uris) == 2 and second.archive_uris[1].endswith(
            "0000000009-0000000009.parquet"
        )
    events = session_events(
        srv.target, sid, lambda ev: any(e.type == EV.SESSION_EVENT_TYPE_RESUMED for e in ev)
    )
    types = [e.type for e in events]
    assert EV.SESSION_EVENT_TYPE_RETIRED in types[: types.index(EV.SESSION_EVENT_TYPE_RESUMED)]
    r.close()
