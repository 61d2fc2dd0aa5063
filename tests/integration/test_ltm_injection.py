"""Hostile ids and contents through every long-term-memory RPC of the real server: no caller string
reaches LanceDB's SQL text, so no call can touch another user's rows (see ``ltm.filters``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import memlane
from memlane.v1 import admin_pb2 as apb
from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import session_pb2 as spb
from tests.hostile import HOSTILE, hostile_ids

# What a hostile call may get back: a precise refusal, never INTERNAL or UNKNOWN.
_PRECISE = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.PERMISSION_DENIED,
}
ATTACK = "a\\')) OR true --"


def caller(user: str, agent: str = "agent-a") -> mpb.Caller:
    return mpb.Caller(user_id=user, agent_id=agent)


def snapshot(api: memlane.Client, users: list[str]) -> dict[str, list[bytes]]:
    """Every row of these users, retired ones included, byte for byte."""
    out = {}
    for u in users:
        page = api.list_memories(
            caller=mpb.Caller(user_id=u), filter=mpb.MemoryFilter(include_retired=True), page_size=500
        )
        out[u] = sorted(m.SerializeToString(deterministic=True) for m in page.memories)
    return out


def seed(api: memlane.Client, user: str) -> list[str]:
    ids = []
    for kind, scope, text in [
        (mpb.MEMORY_KIND_FACT, mpb.MEMORY_SCOPE_USER, "owns a green canoe called Heron"),
        (mpb.MEMORY_KIND_PREFERENCE, mpb.MEMORY_SCOPE_AGENT, "prefers window seats on trains"),
        (mpb.MEMORY_KIND_INSTRUCTION, mpb.MEMORY_SCOPE_GROUP, "wants answers in Portuguese"),
    ]:
        ids.append(
            api.create_memory(
                caller=mpb.Caller(user_id=user, agent_id="agent-a", groups=["g1"]),
                kind=kind,
                scope=scope,
                group="g1" if scope == mpb.MEMORY_SCOPE_GROUP else "",
                content=f"User {text} ({uuid.uuid4().hex[:6]}).",
            ).memory.memory_id
        )
    return ids


def active(api: memlane.Client, user: str) -> set[str]:
    return {m.memory_id for m in api.list_memories(caller=mpb.Caller(user_id=user), page_size=500).memories}


def test_wrong_feedback_with_an_injected_user_id_retires_only_the_callers_item(
    client: memlane.Client,
) -> None:
    victim = f"victim-{uuid.uuid4().hex[:8]}"
    victims = set(seed(client, victim))
    assert len(victims) == 3
    assert active(client, victim) == victims
    mine = client.create_memory(
        caller=caller(ATTACK), kind=mpb.MEMORY_KIND_FACT, content="Attacker owns a red kayak."
    ).memory
    assert mine.user_id == ATTACK

    client.record_feedback(
        caller=caller(ATTACK), memory_id=mine.memory_id, verdict=mpb.FEEDBACK_VERDICT_WRONG
    )

    # Positive control: WRONG did retire the caller's own item...
    assert active(client, ATTACK) == set()
    got = client.get_memory(caller=caller(ATTACK), memory_id=mine.memory_id).memory
    assert got.wrong_count == 1 and got.valid_until_unix_ms > 0
    # ...and nothing of anybody else.
    assert active(client, victim) == victims


def _call(fn: Callable[..., Any], **fields: Any) -> Any:
    try:
        return fn(**fields)
    except memlane.MemlaneError as exc:
        assert exc.code in _PRECISE, f"{fn}: {exc.code} {exc}"
        return None


@pytest.fixture(scope="module")
def bystanders(client: memlane.Client) -> list[str]:
    users = [f"bystander-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    for u in users:
        seed(client, u)
    return users


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    uid=hostile_ids(),
    mid=hostile_ids(),
    group=hostile_ids(),
    content=st.one_of(st.sampled_from(HOSTILE), st.text(min_size=1, max_size=64)),
)
def test_hostile_calls_never_touch_another_users_rows(
    client: memlane.Client, bystanders: list[str], *, uid: str, mid: str, group: str, content: str
) -> None:
    before = snapshot(client, bystanders)
    who = mpb.Caller(user_id=uid, agent_id=mid, groups=[group])
    created = _call(
        client.create_memory,
        caller=who,
        kind=mpb.MEMORY_KIND_FACT,
        content=f"Note {content}",
        memory_id=mid,
        group=group,
        channel=group,
        source_session_id=mid,
    )
    target = created.memory.memory_id if created else mid
    for verdict in (mpb.FEEDBACK_VERDICT_USEFUL, mpb.FEEDBACK_VERDICT_WRONG, mpb.FEEDBACK_VERDICT_USEFUL):
        _call(client.record_feedback, caller=who, memory_id=target, verdict=verdict)
    _call(
        client.update_memory,
        caller=who,
        memory=mpb.Memory(memory_id=target, content=f"Changed {content}", slot=content),
        update_mask=FieldMask(paths=["content", "slot"]),
    )
    _call(
        client.extract_memories,
        caller=who,
        session_id=mid,
        channel=group,
        messages=[spb.Message(message_id=mid, role=spb.ROLE_USER, content=f"I live in Oslo. {content}")],
        include_episodes=True,
    )
    _call(client.search_memories, caller=who, query=f"{content} canoe", limit=5)
    _call(client.get_profile, caller=who)
    _call(client.list_memories, caller=who, filter=mpb.MemoryFilter(channel=group, include_retired=True))
    _call(client.get_memory, caller=who, memory_id=target)
    _call(client.delete_memory, caller=who, memory_id=target)
    _call(client.delete_memory, caller=who, memory_id=mid)
    _call(lambda **kw: list(client.export_user_data(**kw)), user_id=uid, format=apb.EXPORT_FORMAT_JSONL)
    _call(client.forget_user, user_id=uid)
    assert snapshot(client, bystanders) == before
    assert all(before[u] for u in bystanders)  # positive control: the snapshot holds their rows
