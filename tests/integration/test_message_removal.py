"""RemoveMessages through the real server: by id, pop (last N), clear; idempotent retries, monotonic
seqs, consistent totals and summary, and the write rule of access control."""

from __future__ import annotations

import threading
import uuid

import pytest

import memlane
from memlane import Message, Role, VisibilityKind
from memlane.v1 import context_pb2 as cpb
from memlane_server.background import SidecarThread
from tests.access_policy import tokens_policy
from tests.conftest import ServerFactory, wait_for
from tests.peers.openai_compat import LoggedRequest, OpenAICompatServer


def _session(client: memlane.Client, user_id: str, n: int) -> tuple[str, list[str]]:
    sid = client.create_session(user_id=user_id).session.session_id
    out = client.append_messages(
        session_id=sid,
        messages=[Message(role=Role.ROLE_USER, content=f"message number {i}") for i in range(n)],
    )
    return sid, [r.message_id for r in out.results]


def _ids(client: memlane.Client, sid: str) -> list[str]:
    return [m.message_id for m in client.list_messages(session_id=sid, page_size=1000).messages]


def test_pop_returns_the_last_messages_once_even_when_retried(client: memlane.Client, user_id: str) -> None:
    sid, ids = _session(client, user_id, 5)
    before = client.get_session(session_id=sid).session
    first = client.remove_messages(session_id=sid, request_id="pop-1", last=2)
    assert [m.message_id for m in first.removed] == ids[3:]
    assert [m.content for m in first.removed] == ["message number 3", "message number 4"]
    assert first.removed_count == 2 and first.message_count == 3
    removed_tokens = sum(m.token_count for m in first.removed)
    assert first.token_total == before.token_total - removed_tokens > 0
    # The same request again removes nothing more and answers the same.
    again = client.remove_messages(session_id=sid, request_id="pop-1", last=2)
    assert [m.message_id for m in again.removed] == ids[3:]
    assert _ids(client, sid) == ids[:3]
    # A new request id is a new pop.
    assert [m.message_id for m in client.remove_messages(session_id=sid, last=1).removed] == ids[2:3]
    assert _ids(client, sid) == ids[:2]


def test_remove_by_id_keeps_seq_monotonic(client: memlane.Client, user_id: str) -> None:
    sid, ids = _session(client, user_id, 3)
    out = client.remove_messages(session_id=sid, message_ids=[ids[1], "never-stored"])
    assert out.removed_count == 1 and [m.message_id for m in out.removed] == [ids[1]]
    nxt = client.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="after")])
    assert nxt.results[0].seq == 4  # never reuses a removed seq
    assert _ids(client, sid) == [ids[0], ids[2], nxt.results[0].message_id]


def test_clear_keeps_the_session_and_resets_totals(client: memlane.Client, user_id: str) -> None:
    sid, _ = _session(client, user_id, 4)
    out = client.remove_messages(session_id=sid, all=True)
    assert out.removed_count == 4 and out.token_total == 0 and out.message_count == 0
    s = client.get_session(session_id=sid).session
    assert s.message_count == 0 and s.token_total == 0 and s.summary.through_seq == 0
    assert _ids(client, sid) == []
    nxt = client.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="fresh")])
    assert nxt.results[0].seq == 5
    assert client.get_session(session_id=sid).session.message_count == 1


def test_bad_removals_are_refused_precisely(client: memlane.Client, user_id: str) -> None:
    sid, ids = _session(client, user_id, 1)
    with pytest.raises(memlane.InvalidArgumentError, match="exactly one"):
        client.remove_messages(session_id=sid, last=1, all=True)
    with pytest.raises(memlane.InvalidArgumentError, match="exactly one"):
        client.remove_messages(session_id=sid)
    with pytest.raises(memlane.InvalidArgumentError, match="last"):
        client.remove_messages(session_id=sid, last=5000)
    with pytest.raises(memlane.InvalidArgumentError, match=r"message_ids\[0\]"):
        client.remove_messages(session_id=sid, message_ids=["bad {slot} id"])
    with pytest.raises(memlane.NotFoundError):
        client.remove_messages(session_id=f"missing-{uuid.uuid4().hex}", last=1)
    assert _ids(client, sid) == ids  # nothing was removed by the refused calls


TOKENS = {a: f"tok-{a}-{uuid.uuid4().hex[:6]}" for a in ("alpha", "beta", "auditor")}


@pytest.fixture(scope="module")
def secured(start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> SidecarThread:
    path = tokens_policy(tmp_path_factory.mktemp("policy") / "policy.yaml", TOKENS)
    return start_server(auth_required=True, access_policy_file=str(path))


def test_only_a_message_s_writer_removes_it(secured: SidecarThread, user_id: str) -> None:
    with (
        memlane.Client(secured.target, token=TOKENS["alpha"], timeout=10) as alpha,
        memlane.Client(secured.target, token=TOKENS["beta"], timeout=10) as beta,
        memlane.Client(secured.target, token=TOKENS["auditor"], timeout=10) as auditor,
    ):
        sid, ids = _session(alpha, user_id, 2)
        with pytest.raises(memlane.PermissionDeniedError):
            beta.remove_messages(session_id=sid, last=1)
        with pytest.raises(memlane.PermissionDeniedError):
            auditor.remove_messages(session_id=sid, message_ids=[ids[0]])
        with pytest.raises(memlane.PermissionDeniedError):
            beta.remove_messages(session_id=sid, all=True)
        assert _ids(alpha, sid) == ids  # positive control below: the writer may
        assert alpha.remove_messages(session_id=sid, last=1).removed_count == 1
        assert _ids(alpha, sid) == ids[:1]


def test_a_replayed_request_id_never_hands_another_agent_s_removed_turn(
    secured: SidecarThread, user_id: str
) -> None:
    with (
        memlane.Client(secured.target, token=TOKENS["alpha"], timeout=10) as alpha,
        memlane.Client(secured.target, token=TOKENS["beta"], timeout=10) as beta,
    ):
        sid = alpha.create_session(user_id=user_id).session.session_id
        secret = Message(role=Role.ROLE_USER, content="alpha's vault code is VC-9917")
        secret.visibility = VisibilityKind.VISIBILITY_KIND_AGENT
        alpha.append_messages(session_id=sid, messages=[secret])
        first = alpha.remove_messages(session_id=sid, request_id="pop-shared-id", last=1)
        assert [m.content for m in first.removed] == [secret.content]
        # Positive control: alpha's own retry gets its answer back.
        again = alpha.remove_messages(session_id=sid, request_id="pop-shared-id", last=1)
        assert [m.content for m in again.removed] == [secret.content]
        # beta reusing the request id (with requests that pass the pre-check) must not read it.
        with pytest.raises(memlane.PermissionDeniedError):
            beta.remove_messages(session_id=sid, request_id="pop-shared-id", message_ids=["nope"])
        with pytest.raises(memlane.PermissionDeniedError):
            beta.remove_messages(session_id=sid, request_id="pop-shared-id", all=True)


def test_a_summary_read_before_a_removal_never_stores_the_removed_turn(start_server: ServerFactory) -> None:
    entered, release = threading.Event(), threading.Event()

    def respond(req: LoggedRequest) -> str:
        entered.set()
        release.wait(30)  # the first run is held here while the turn is removed
        return "SUMMARY: " + req.prompt_text

    with OpenAICompatServer(api_key="k") as llm:
        llm.responder = respond
        srv = start_server(
            summarizer="openai",
            summarizer_base_url=llm.base_url,
            summarizer_model="m",
            summarizer_api_key="k",
        )
        with memlane.Client(srv.target, timeout=30) as c:
            sid = c.create_session(user_id="u-race").session.session_id
            turns = [Message(role=Role.ROLE_USER, content=f"turn {i}: " + "filler " * 20) for i in range(60)]
            turns[2] = Message(role=Role.ROLE_USER, content="my card number is CN-55190")
            turns[1] = Message(role=Role.ROLE_USER, content="my order is ORD-44120")

            def assemble() -> cpb.AssembleStats:
                parts = c.assemble_context(
                    session_id=sid, context_window_tokens=1000, reserved_output_tokens=200, system_prompt=""
                )
                stats = [p.stats for p in parts if p.HasField("stats")]  # on the last part: read them all
                return stats[0]

            ids: list[str] = []
            for lo in range(0, 60, 5):  # an agent loop: a few turns, then an assembly
                out = c.append_messages(session_id=sid, messages=turns[lo : lo + 5])
                ids += [r.message_id for r in out.results]
                if assemble().summarization_scheduled:
                    break
            else:
                pytest.fail("no summarization was scheduled")
            assert entered.wait(30)
            assert c.remove_messages(session_id=sid, message_ids=[ids[2]]).removed_count == 1
            release.set()

            def landed() -> str | None:
                assemble()
                s = c.get_session(session_id=sid).session.summary
                return s.text if s.through_seq > 0 else None

            text = wait_for(landed, timeout=60)
            assert "ORD-44120" in text  # positive control: the summary holds the turns it covers
            assert "CN-55190" not in text


def test_a_removed_turn_leaves_the_encoded_turns_of_its_session(
    server: SidecarThread, client: memlane.Client, user_id: str
) -> None:
    """Assembly keeps each turn's encoded form; a removal drops the session's (the next assembly sees
    a document that did not only grow), so a removed turn's text is not kept in memory."""
    sid = client.create_session(user_id=user_id).session.session_id
    client.append_messages(
        session_id=sid,
        messages=[Message(role=Role.ROLE_USER, content=t) for t in ("my PIN is 4417", "hello")],
    )
    first = client.list_messages(session_id=sid).messages[0]
    list(client.assemble_context(session_id=sid, user_input="hi"))
    memo = server.sidecar.context.turn_memo  # type: ignore[union-attr]
    assert memo.get(sid, first.message_id, first.seq)  # positive control
    client.remove_messages(session_id=sid, message_ids=[first.message_id])
    blocks = [b for r in client.assemble_context(session_id=sid, user_input="hi") for b in r.blocks]
    assert memo.get(sid, first.message_id, first.seq) is None
    assert all("4417" not in m.content for b in blocks for m in b.messages)


def test_forget_user_drops_the_encoded_turns_of_their_sessions(
    server: SidecarThread, client: memlane.Client, user_id: str
) -> None:
    sid = client.create_session(user_id=user_id).session.session_id
    client.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="I keep bees.")])
    stored = client.list_messages(session_id=sid).messages[0]
    list(client.assemble_context(session_id=sid, user_input="what do I keep?"))
    memo = server.sidecar.context.turn_memo  # type: ignore[union-attr]
    assert memo.get(sid, stored.message_id, stored.seq)  # positive control
    client.forget_user(user_id=user_id)
    assert memo.get(sid, stored.message_id, stored.seq) is None
