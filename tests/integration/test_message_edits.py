"""UpdateMessage through the real server: a stored message's content, native object, metadata and tool
call ids replaced in place (a guardrail's redaction); id, seq, role, author, visibility and time kept;
token totals and summaries follow; retries are harmless; the RemoveMessages write rule; erasure and
export see the edited message."""

from __future__ import annotations

import json
import uuid

import pytest
from google.protobuf.field_mask_pb2 import FieldMask

import memlane
from memlane import Message, Role, VisibilityKind
from memlane.v1 import session_pb2 as pb
from memlane_server.background import SidecarThread
from tests.access_policy import tokens_policy
from tests.conftest import ServerFactory


def _session(client: memlane.Client, user_id: str, n: int) -> tuple[str, list[str]]:
    sid = client.create_session(user_id=user_id).session.session_id
    out = client.append_messages(
        session_id=sid,
        messages=[
            Message(
                role=Role.ROLE_USER,
                content=f"message {i}: my card is 4111 1111 1111 1111, please keep it",
                native=pb.NativeMessage(format="strands", json=json.dumps({"text": f"raw {i}"})),
                metadata={"k": "v"},
            )
            for i in range(n)
        ],
    )
    return sid, [r.message_id for r in out.results]


def _mask(*paths: str) -> FieldMask:
    return FieldMask(paths=list(paths))


def test_an_edit_replaces_what_a_message_says_and_keeps_the_rest(
    client: memlane.Client, user_id: str
) -> None:
    sid, ids = _session(client, user_id, 3)
    before = client.list_messages(session_id=sid).messages
    total_before = client.get_session(session_id=sid).session.token_total
    redacted = Message(
        message_id=ids[1],
        content="[redacted]",
        native=pb.NativeMessage(format="strands", json='{"text": "[redacted]"}'),
        metadata={"redacted": "guardrail"},
        # Not in the mask, or not editable at all: ignored.
        role=Role.ROLE_SYSTEM,
        source_agent_id="someone-else",
        visibility=VisibilityKind.VISIBILITY_KIND_AGENT,
        tool_call_ids=["t1"],
    )
    out = client.update_message(
        session_id=sid, message=redacted, update_mask=_mask("content", "native", "metadata")
    )
    m = out.message
    assert (m.message_id, m.seq, m.role, m.created_at_unix_ms) == (
        ids[1],
        before[1].seq,
        Role.ROLE_USER,
        before[1].created_at_unix_ms,
    )
    assert m.content == "[redacted]" and m.native.json == '{"text": "[redacted]"}'
    assert dict(m.metadata) == {"redacted": "guardrail"} and list(m.tool_call_ids) == []
    assert m.source_agent_id == before[1].source_agent_id and m.visibility == before[1].visibility
    assert m.token_count < before[1].token_count
    assert out.token_total == total_before - before[1].token_count + m.token_count
    after = client.list_messages(session_id=sid).messages
    assert [x.content for x in after] == [before[0].content, "[redacted]", before[2].content]
    assert client.get_session(session_id=sid).session.token_total == out.token_total
    # The same edit again (a retry) changes nothing.
    again = client.update_message(
        session_id=sid, message=redacted, update_mask=_mask("content", "native", "metadata")
    )
    assert again.message == m and again.token_total == out.token_total
    # A retried append of the original stays a duplicate: it does not undo the redaction.
    original = Message(
        message_id=ids[1],
        role=Role.ROLE_USER,
        content=before[1].content,
        native=pb.NativeMessage(format="strands", json=json.dumps({"text": "raw 1"})),
        metadata={"k": "v"},
    )
    dup = client.append_messages(session_id=sid, messages=[original])
    assert dup.results[0].duplicate
    assert client.list_messages(session_id=sid).messages[1].content == "[redacted]"


def test_bad_edits_are_refused_precisely(client: memlane.Client, user_id: str) -> None:
    sid, ids = _session(client, user_id, 1)
    edit = Message(message_id=ids[0], content="x")
    with pytest.raises(memlane.InvalidArgumentError, match="update_mask"):
        client.update_message(session_id=sid, message=edit)
    with pytest.raises(memlane.InvalidArgumentError, match="not editable"):
        client.update_message(session_id=sid, message=edit, update_mask=_mask("role"))
    with pytest.raises(memlane.NotFoundError):
        client.update_message(
            session_id=sid, message=Message(message_id="never-stored"), update_mask=_mask("content")
        )
    with pytest.raises(memlane.NotFoundError):
        client.update_message(session_id="no-such-session", message=edit, update_mask=_mask("content"))
    with pytest.raises(memlane.InvalidArgumentError, match="message_id"):
        client.update_message(
            session_id=sid, message=Message(message_id="a{b}"), update_mask=_mask("content")
        )
    with pytest.raises(memlane.InvalidArgumentError, match="native"):
        client.update_message(
            session_id=sid,
            message=Message(message_id=ids[0], native=pb.NativeMessage(format="x", json="{nope")),
            update_mask=_mask("native"),
        )
    with pytest.raises(memlane.InvalidArgumentError, match="no content"):  # nothing left to hold
        client.update_message(
            session_id=sid, message=Message(message_id=ids[0]), update_mask=_mask("content", "native")
        )
    with pytest.raises(memlane.ResourceExhaustedError):
        client.update_message(
            session_id=sid,
            message=Message(message_id=ids[0], content="y" * 300_000),
            update_mask=_mask("content"),
        )
    # Positive control: the message is untouched by all of the above, and a good edit lands.
    assert "4111" in client.list_messages(session_id=sid).messages[0].content
    client.update_message(session_id=sid, message=edit, update_mask=_mask("content"))
    assert client.list_messages(session_id=sid).messages[0].content == "x"


def test_a_summary_covering_the_edited_message_is_reset(start_server: ServerFactory) -> None:
    with memlane.Client(start_server(summarizer="client").target, timeout=10) as c:
        sid, ids = _session(c, f"u-{uuid.uuid4().hex[:8]}", 4)

        def summarize(through: int) -> None:
            c.submit_summary(
                session_id=sid,
                text="The user shared a card number 4111 1111 1111 1111.",
                after_seq=0,
                through_seq=through,
                through_message_id=ids[through - 1],
            )

        summarize(2)
        # Editing a message after the summary's range keeps it (positive control for the reset below).
        c.update_message(
            session_id=sid, message=Message(message_id=ids[3], content="later"), update_mask=_mask("content")
        )
        assert c.get_session(session_id=sid).session.summary.through_seq == 2
        c.update_message(
            session_id=sid,
            message=Message(message_id=ids[1], content="[redacted]"),
            update_mask=_mask("content"),
        )
        summary = c.get_session(session_id=sid).session.summary
        assert summary.through_seq == 0 and summary.text == ""


def test_erasure_and_export_see_the_edited_message(client: memlane.Client, user_id: str) -> None:
    sid, ids = _session(client, user_id, 2)
    client.update_message(
        session_id=sid, message=Message(message_id=ids[0], content="[redacted]"), update_mask=_mask("content")
    )
    exported = "".join(str(part) for part in client.export_user_data(user_id=user_id))
    assert "[redacted]" in exported and "message 1: my card" in exported  # the other message: unchanged
    assert "message 0: my card" not in exported
    client.forget_user(user_id=user_id)
    with pytest.raises(memlane.NotFoundError):
        client.update_message(
            session_id=sid, message=Message(message_id=ids[1], content="z"), update_mask=_mask("content")
        )


TOKENS = {a: f"tok-{a}-{uuid.uuid4().hex[:6]}" for a in ("alpha", "beta", "auditor")}


@pytest.fixture(scope="module")
def secured(start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory) -> SidecarThread:
    path = tokens_policy(tmp_path_factory.mktemp("policy") / "policy.yaml", TOKENS)
    return start_server(auth_required=True, access_policy_file=str(path))


def test_only_a_message_s_writer_edits_it(secured: SidecarThread, user_id: str) -> None:
    with (
        memlane.Client(secured.target, token=TOKENS["alpha"], timeout=10) as alpha,
        memlane.Client(secured.target, token=TOKENS["beta"], timeout=10) as beta,
        memlane.Client(secured.target, token=TOKENS["auditor"], timeout=10) as auditor,
    ):
        sid = alpha.create_session(user_id=user_id).session.session_id
        private = Message(role=Role.ROLE_USER, content="alpha's vault code is VC-9917")
        private.visibility = VisibilityKind.VISIBILITY_KIND_AGENT
        mid = alpha.append_messages(session_id=sid, messages=[private]).results[0].message_id
        edit = Message(message_id=mid, content="overwritten by someone else")
        for other in (beta, auditor):
            with pytest.raises(memlane.PermissionDeniedError):
                other.update_message(session_id=sid, message=edit, update_mask=_mask("content"))
        assert alpha.list_messages(session_id=sid).messages[0].content == private.content
        # Positive control: the writer may; the message stays alpha's and private.
        out = alpha.update_message(
            session_id=sid,
            message=Message(message_id=mid, content="[redacted]"),
            update_mask=_mask("content"),
        )
        assert out.message.source_agent_id == "alpha"
        assert out.message.visibility == VisibilityKind.VISIBILITY_KIND_AGENT
        assert beta.list_messages(session_id=sid).messages == []  # still hidden from beta
