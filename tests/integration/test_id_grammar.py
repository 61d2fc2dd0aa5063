"""One id grammar for every RPC, through the real server: ids the memory API accepts are accepted by
sessions and are exportable and erasable; ids outside the grammar are refused by every servicer with
INVALID_ARGUMENT naming the field (nested fields by path)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

import memlane
from memlane import Message, Role
from memlane.v1 import memory_pb2 as mpb


@pytest.mark.parametrize("base", ["o'brien", "bob+tag@example.com", "José", "user 42", "a\\')) OR true --"])
def test_every_accepted_user_id_is_exportable_and_erasable(client: memlane.Client, base: str) -> None:
    user = f"{base}-{uuid.uuid4().hex[:6]}"
    sid = client.create_session(user_id=user, channel="web/eu").session.session_id
    client.append_messages(
        session_id=sid, messages=[Message(role=Role.ROLE_USER, content="I collect stamps.")]
    )
    client.create_memory(
        caller=mpb.Caller(user_id=user), kind=mpb.MEMORY_KIND_FACT, content="User collects stamps."
    )
    exported = list(client.export_user_data(user_id=user))
    assert {"session", "message", "memory"} <= {r.kind for r in exported}
    receipt = client.forget_user(user_id=user)
    assert receipt.erased["redis.sessions"] == 1 and receipt.erased["lancedb.items"] == 1
    assert list(client.export_user_data(user_id=user)) == []


def _rejects(call: Callable[[], Any], field: str) -> None:
    with pytest.raises(memlane.InvalidArgumentError, match=f"^{field} "):
        call()


def test_ids_outside_the_grammar_are_refused_naming_the_field(client: memlane.Client) -> None:
    sid = client.create_session(user_id=f"u-{uuid.uuid4().hex[:6]}").session.session_id
    _rejects(
        lambda: client.create_memory(
            caller=mpb.Caller(user_id="a\nb"), kind=mpb.MEMORY_KIND_FACT, content="x"
        ),
        r"caller\.user_id",
    )
    _rejects(
        lambda: client.search_memories(caller=mpb.Caller(user_id="u", groups=["ok", "g{1}"]), query="x"),
        r"caller\.groups\[1\]",
    )
    _rejects(lambda: client.create_session(user_id="{x}"), "user_id")
    _rejects(lambda: client.create_session(user_id="u", channel="web\u202e"), "channel")
    _rejects(lambda: client.get_session(session_id="a/../b"), "session_id")
    _rejects(
        lambda: client.append_messages(
            session_id=sid,
            messages=[
                Message(role=Role.ROLE_USER, content="fine"),
                Message(role=Role.ROLE_ASSISTANT, content="x", source_agent_id="bot\tid"),
            ],
        ),
        r"messages\[1\]\.source_agent_id",
    )
    _rejects(lambda: list(client.assemble_context(session_id="s\x00")), "session_id")
    _rejects(lambda: client.forget_user(user_id="alice "), "user_id")
    _rejects(lambda: list(client.export_user_data(user_id="_alice")), "user_id")
    _rejects(lambda: client.delete_memory(caller=mpb.Caller(user_id="u"), memory_id="m\u2028"), "memory_id")


def test_a_composed_and_a_decomposed_name_are_one_user(client: memlane.Client) -> None:
    """ "José" typed (é: U+00E9) and pasted (e + U+0301) is one person: one user's data, one erasure."""
    tag = uuid.uuid4().hex[:6]
    composed, decomposed = f"Jos\u00e9-{tag}", f"Jose\u0301-{tag}"
    other = f"Jos\u00e8-{tag}"  # a different letter (è), a different user
    client.create_memory(caller=mpb.Caller(user_id=composed), kind=mpb.MEMORY_KIND_FACT, content="Likes tea.")
    sid = client.create_session(user_id=decomposed).session.session_id
    # A turn with no fact in it: a fact would be learnt at once (learn_facts_on_append), a second memory.
    client.append_messages(session_id=sid, messages=[Message(role=Role.ROLE_USER, content="Hi, me again.")])
    client.create_memory(caller=mpb.Caller(user_id=other), kind=mpb.MEMORY_KIND_FACT, content="Likes coffee.")

    assert client.get_session(session_id=sid).session.user_id == composed  # stored in NFC
    seen = client.list_memories(caller=mpb.Caller(user_id=decomposed)).memories
    assert [m.content for m in seen] == ["Likes tea."] and seen[0].user_id == composed
    assert {r.kind for r in client.export_user_data(user_id=composed)} >= {"session", "memory"}

    receipt = client.forget_user(user_id=decomposed)  # erasure by the other form
    assert receipt.user_id == composed
    assert receipt.erased["redis.sessions"] == 1 and receipt.erased["lancedb.items"] == 1
    assert list(client.export_user_data(user_id=composed)) == []
    assert list(client.export_user_data(user_id=decomposed)) == []
    # Positive control: a user whose name differs by its letter, not its encoding, is untouched.
    assert [m.content for m in client.list_memories(caller=mpb.Caller(user_id=other)).memories] == [
        "Likes coffee."
    ]
