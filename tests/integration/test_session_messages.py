"""Sessions and messages through the real client, server and Redis."""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import pytest
from google.protobuf.field_mask_pb2 import FieldMask

import memlane
from memlane import Message, MessageOrder, NativeMessage, Role, SessionStatus
from memlane.v1 import session_pb2
from memlane_server.background import SidecarThread


def _new(client: memlane.Client, user_id: str, **kw: Any) -> str:
    return client.create_session(user_id=user_id, **kw).session.session_id


def _msgs(n: int, start: int = 0, **kw: Any) -> list[Message]:
    return [
        Message(role=Role.ROLE_USER if i % 2 == 0 else Role.ROLE_ASSISTANT, content=f"turn {i}", **kw)
        for i in range(start, start + n)
    ]


def test_create_is_idempotent_and_get_returns_the_document(client: memlane.Client, user_id: str) -> None:
    first = client.create_session(
        session_id="s-" + user_id,
        user_id=user_id,
        agent_id="planner",
        channel="web",
        participants=["alice", "planner"],
        tags=["demo"],
        metadata={"ticket": "T-1"},
        ttl_seconds=120,
    )
    assert first.created
    again = client.create_session(session_id="s-" + user_id, user_id=user_id)
    assert not again.created
    assert again.session.created_at_unix_ms == first.session.created_at_unix_ms
    got = client.get_session(session_id="s-" + user_id).session
    assert got.user_id == user_id and got.agent_id == "planner" and got.channel == "web"
    assert list(got.participants) == ["alice", "planner"] and dict(got.metadata) == {"ticket": "T-1"}
    assert got.status == SessionStatus.SESSION_STATUS_ACTIVE
    assert got.promotion_state == memlane.PromotionState.PROMOTION_STATE_NONE
    assert got.ttl_seconds == 120
    with pytest.raises(memlane.AlreadyExistsError, match="another user"):
        client.create_session(session_id="s-" + user_id, user_id="someone-else")


def test_append_assigns_order_and_counts_tokens(client: memlane.Client, user_id: str) -> None:
    sid = _new(client, user_id)
    native = json.dumps({"type": "human", "data": {"content": "hello there", "id": "lc-1"}})
    resp = client.append_messages(
        session_id=sid,
        messages=[
            Message(
                role=Role.ROLE_USER,
                content="hello there",
                participant_name="alice",
                native=NativeMessage(format="langchain", json=native),
                metadata={"k": "v"},
            ),
            Message(
                role=Role.ROLE_ASSISTANT,
                content="Hi Alice! How can I help?",
                source_agent_id="helper",
                tool_call_ids=["call_1"],
            ),
        ],
    )
    assert [r.seq for r in resp.results] == [1, 2]
    assert not any(r.duplicate for r in resp.results)
    assert resp.results[0].token_count == 2  # "hello there" in cl100k_base
    assert resp.message_count == 2 and resp.token_total == sum(r.token_count for r in resp.results)
    msgs = client.list_messages(session_id=sid).messages
    assert [m.content for m in msgs] == ["hello there", "Hi Alice! How can I help?"]
    assert msgs[0].native.format == "langchain" and json.loads(msgs[0].native.json)["data"]["id"] == "lc-1"
    assert msgs[0].participant_name == "alice" and dict(msgs[0].metadata) == {"k": "v"}
    assert msgs[1].source_agent_id == "helper" and list(msgs[1].tool_call_ids) == ["call_1"]
    assert all(m.session_id == sid and m.created_at_unix_ms > 0 for m in msgs)
    doc = client.get_session(session_id=sid).session
    assert doc.token_total == resp.token_total and doc.message_count == 2


def test_token_count_follows_the_sessions_model(client: memlane.Client, user_id: str) -> None:
    text = "Привет, как дела? 東京で会いましょう。"
    counts = {}
    for model in ("gpt-4", "gpt-4o"):
        sid = _new(client, user_id, model=model)
        counts[model] = (
            client.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content=text)])
            .results[0]
            .token_count
        )
    assert counts["gpt-4o"] < counts["gpt-4"]  # o200k_base packs these scripts tighter than cl100k_base


def test_re_sending_a_message_id_is_a_no_op(client: memlane.Client, user_id: str) -> None:
    sid = _new(client, user_id)
    batch = [Message(message_id=f"m{i}", role=Role.ROLE_USER, content=f"c{i}") for i in range(3)]
    first = client.append_messages(session_id=sid, messages=batch)
    again = client.append_messages(
        session_id=sid, messages=[*batch[1:], Message(message_id="m3", role=Role.ROLE_USER, content="c3")]
    )
    assert [r.duplicate for r in again.results] == [True, True, False]
    assert [r.seq for r in again.results] == [2, 3, 4]
    assert again.message_count == 4 and again.token_total == first.token_total + again.results[2].token_count
    assert [m.message_id for m in client.list_messages(session_id=sid).messages] == ["m0", "m1", "m2", "m3"]


def test_reused_id_with_other_content_fails_the_whole_batch(client: memlane.Client, user_id: str) -> None:
    sid = _new(client, user_id)
    client.append_messages(
        session_id=sid, messages=[Message(message_id="a", role=Role.ROLE_USER, content="x")]
    )
    with pytest.raises(memlane.AlreadyExistsError, match=r"'a'.*different content"):
        client.append_messages(
            session_id=sid,
            messages=[
                Message(message_id="b", role=Role.ROLE_USER, content="new"),
                Message(message_id="a", role=Role.ROLE_USER, content="changed"),
            ],
        )
    assert [m.message_id for m in client.list_messages(session_id=sid).messages] == ["a"]  # "b" not written
    assert client.get_session(session_id=sid).session.message_count == 1


def test_pagination_both_orders(client: memlane.Client, user_id: str) -> None:
    sid = _new(client, user_id)
    client.append_messages(session_id=sid, messages=_msgs(25))
    seen: list[str] = []
    token = ""
    while True:
        page = client.list_messages(session_id=sid, page_size=10, page_token=token)
        seen += [m.content for m in page.messages]
        token = page.next_page_token
        if not token:
            break
    assert seen == [f"turn {i}" for i in range(25)]
    newest = list(
        memlane.iter_pages(
            lambda t: client.list_messages(
                session_id=sid, page_size=7, page_token=t, order=MessageOrder.MESSAGE_ORDER_NEWEST_FIRST
            ),
            "messages",
        )
    )
    assert [m.content for m in newest] == [f"turn {i}" for i in reversed(range(25))]
    last3 = client.list_messages(session_id=sid, page_size=3, order=MessageOrder.MESSAGE_ORDER_NEWEST_FIRST)
    assert [m.seq for m in last3.messages] == [25, 24, 23] and last3.next_page_token


def test_filters_by_time_role_and_agent(client: memlane.Client, user_id: str) -> None:
    sid = _new(client, user_id)
    base = 1_700_000_000_000
    client.append_messages(
        session_id=sid,
        messages=[
            Message(role=Role.ROLE_USER, content="u1", created_at_unix_ms=base),
            Message(
                role=Role.ROLE_ASSISTANT,
                content="a1",
                source_agent_id="researcher",
                created_at_unix_ms=base + 10,
            ),
            Message(
                role=Role.ROLE_TOOL, content="t1", source_agent_id="researcher", created_at_unix_ms=base + 20
            ),
            Message(
                role=Role.ROLE_ASSISTANT, content="a2", source_agent_id="writer", created_at_unix_ms=base + 30
            ),
            Message(role=Role.ROLE_USER, content="u2", created_at_unix_ms=base + 40),
        ],
    )

    def contents(**kw: Any) -> list[str]:
        pages = memlane.iter_pages(
            lambda t: client.list_messages(session_id=sid, page_size=2, page_token=t, **kw), "messages"
        )
        return [m.content for m in pages]

    assert contents(roles=[Role.ROLE_ASSISTANT]) == ["a1", "a2"]
    assert contents(source_agent_ids=["researcher"]) == ["a1", "t1"]
    assert contents(after_unix_ms=base + 10, before_unix_ms=base + 40) == ["a1", "t1", "a2"]
    assert contents(roles=[Role.ROLE_USER], order=MessageOrder.MESSAGE_ORDER_NEWEST_FIRST) == ["u2", "u1"]


def test_list_sessions_filters_and_pages(client: memlane.Client, user_id: str) -> None:
    ids = [_new(client, user_id, channel="web" if i % 2 else "slack") for i in range(7)]
    client.close_session(session_id=ids[0])
    everything = list(
        memlane.iter_pages(
            lambda t: client.list_sessions(user_id=user_id, page_size=3, page_token=t), "sessions"
        )
    )
    assert [s.session_id for s in everything] == list(reversed(ids))  # newest first
    web = [s.session_id for s in client.list_sessions(user_id=user_id, channel="web").sessions]
    assert web == [ids[i] for i in (5, 3, 1)]
    closed = client.list_sessions(user_id=user_id, status=SessionStatus.SESSION_STATUS_CLOSED).sessions
    assert [s.session_id for s in closed] == [ids[0]]
    cut = everything[3].created_at_unix_ms
    older = client.list_sessions(user_id=user_id, created_before_unix_ms=cut).sessions
    assert all(s.created_at_unix_ms < cut for s in older) and older


def test_update_and_close(client: memlane.Client, user_id: str) -> None:
    sid = _new(client, user_id, tags=["a"])
    updated = client.update_session(
        session=session_pb2.Session(
            session_id=sid, tags=["b", "c"], metadata={"x": "1"}, status=SessionStatus.SESSION_STATUS_IDLE
        ),
        update_mask=FieldMask(paths=["tags", "metadata", "status"]),
    ).session
    assert list(updated.tags) == ["b", "c"] and dict(updated.metadata) == {"x": "1"}
    assert updated.status == SessionStatus.SESSION_STATUS_IDLE and updated.idle_at_unix_ms > 0
    client.append_messages(session_id=sid, messages=_msgs(1))  # activity wakes an idle session
    assert client.get_session(session_id=sid).session.status == SessionStatus.SESSION_STATUS_ACTIVE
    closed = client.close_session(session_id=sid).session
    assert closed.status == SessionStatus.SESSION_STATUS_CLOSED and closed.closed_at_unix_ms > 0
    assert client.close_session(session_id=sid).session.closed_at_unix_ms == closed.closed_at_unix_ms
    with pytest.raises(memlane.FailedPreconditionError, match="closed"):
        client.append_messages(session_id=sid, messages=_msgs(1))
    with pytest.raises(memlane.FailedPreconditionError, match="closed"):
        client.update_session(
            session=session_pb2.Session(session_id=sid, status=SessionStatus.SESSION_STATUS_ACTIVE),
            update_mask=FieldMask(paths=["status"]),
        )
    with pytest.raises(memlane.InvalidArgumentError, match="user_id"):
        client.update_session(
            session=session_pb2.Session(session_id=sid, user_id="x"), update_mask=FieldMask(paths=["user_id"])
        )


def test_concurrent_appends_from_several_clients(server: SidecarThread, user_id: str) -> None:
    target = server.target
    with memlane.Client(target) as c:
        sid = _new(c, user_id)
    writers, per_writer = 6, 40

    def write(w: int) -> list[int]:
        seqs = []
        with memlane.Client(target) as c:
            for i in range(per_writer):
                r = c.append_messages(
                    session_id=sid,
                    messages=[Message(message_id=f"w{w}-{i:03d}", role=Role.ROLE_USER, content=f"{w}:{i}")],
                )
                seqs.append(r.results[0].seq)
        return seqs

    with concurrent.futures.ThreadPoolExecutor(writers) as pool:
        results = list(pool.map(write, range(writers)))
    with memlane.Client(target) as c:
        msgs = list(
            memlane.iter_pages(
                lambda t: c.list_messages(session_id=sid, page_size=100, page_token=t), "messages"
            )
        )
        doc = c.get_session(session_id=sid).session
    assert len(msgs) == writers * per_writer == doc.message_count
    assert [m.seq for m in msgs] == list(range(1, writers * per_writer + 1))
    for w, seqs in enumerate(results):  # each writer's own messages keep their order
        assert seqs == sorted(seqs)
        mine = [m.message_id for m in msgs if m.message_id.startswith(f"w{w}-")]
        assert mine == sorted(mine)
    again = [m.message_id for m in c2_list(target, sid)]
    assert again == [m.message_id for m in msgs]  # order by seq is stable across reads


def c2_list(target: str, sid: str) -> list[Message]:
    with memlane.Client(target) as c:
        return list(
            memlane.iter_pages(
                lambda t: c.list_messages(session_id=sid, page_size=1000, page_token=t), "messages"
            )
        )
