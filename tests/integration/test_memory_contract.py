"""MemoryService promises of issue 11 through the real server: a retried feedback counts once, greetings
are not remembered, dates of birth and IP addresses are not stored; real facts and episodes still are."""

from __future__ import annotations

import pytest
from google.protobuf.field_mask_pb2 import FieldMask

import memlane
from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import session_pb2 as spb


def caller(user: str) -> mpb.Caller:
    return mpb.Caller(user_id=user, agent_id="agent-a")


def test_a_retried_feedback_counts_once(client: memlane.Client, user_id: str) -> None:
    mid = client.create_memory(
        caller=caller(user_id), kind=mpb.MEMORY_KIND_FACT, content="User keeps two cats."
    ).memory.memory_id
    request = mpb.RecordFeedbackRequest(
        caller=caller(user_id), memory_id=mid, verdict=mpb.FEEDBACK_VERDICT_USEFUL
    )
    first = client.record_feedback(request)
    assert request.feedback_id, "the client chooses a feedback id, so its retries are recognised"
    assert first.memory.useful_count == 1
    # The same request again (what the client's retry on UNAVAILABLE sends): counted once.
    again = client.record_feedback(request)
    assert again.memory.useful_count == 1
    got = client.get_memory(caller=caller(user_id), memory_id=mid).memory
    assert (got.useful_count, got.usage_count) == (1, 1)
    # Control: another piece of feedback (a new id) counts.
    client.record_feedback(caller=caller(user_id), memory_id=mid, verdict=mpb.FEEDBACK_VERDICT_USEFUL)
    assert client.get_memory(caller=caller(user_id), memory_id=mid).memory.useful_count == 2
    # A refused feedback does not burn its id: after the refusal, the same id counts.
    with pytest.raises(memlane.NotFoundError):
        client.record_feedback(
            caller=caller(user_id),
            memory_id="no-such-memory",
            verdict=mpb.FEEDBACK_VERDICT_USEFUL,
            feedback_id="f-1",
        )
    client.record_feedback(
        caller=caller(user_id), memory_id=mid, verdict=mpb.FEEDBACK_VERDICT_USEFUL, feedback_id="f-1"
    )
    assert client.get_memory(caller=caller(user_id), memory_id=mid).memory.useful_count == 3
    assert client.forget_user(user_id=user_id).erased["redis.once_marks"] == 3  # erasure takes the marks too
    with pytest.raises(memlane.InvalidArgumentError, match="feedback_id"):
        client.record_feedback(
            caller=caller(user_id), memory_id=mid, verdict=mpb.FEEDBACK_VERDICT_USEFUL, feedback_id="bad id\n"
        )


def _turn(mid: str, text: str, role: spb.Role.ValueType = spb.ROLE_USER) -> spb.Message:
    return spb.Message(message_id=mid, role=role, content=text)


def test_greetings_are_not_remembered_and_facts_are(client: memlane.Client, user_id: str) -> None:
    out = client.extract_memories(
        caller=caller(user_id),
        session_id="greet-1",
        include_episodes=True,
        messages=[
            _turn("m1", "Hi there!"),
            _turn("m2", "Hello! How are you today?", spb.ROLE_ASSISTANT),
            _turn("m3", "I'm fine, thanks. And you?"),
            _turn("m4", "I live in Lisbon and I work as a nurse at the city hospital."),
            _turn("m5", "Thanks! Have a nice day.", spb.ROLE_ASSISTANT),
        ],
    )
    stored = [m.memory for m in out.memories]
    sources = {sid for m in stored for sid in m.source_message_ids}
    assert not sources & {"m1", "m2", "m3", "m5"}, [m.content for m in stored]
    assert "m4" in sources  # control: the factual turn is stored (fact and episode)
    assert any(m.kind == mpb.MEMORY_KIND_EPISODIC and "Lisbon" in m.content for m in stored)
    hits = client.search_memories(caller=caller(user_id), query="Where does the user live?", limit=5).results
    assert hits and "Lisbon" in hits[0].memory.content
    assert not any("Hi there" in h.memory.content or "How are you" in h.memory.content for h in hits)


@pytest.mark.parametrize(
    "text",
    [
        "User's date of birth is 12 March 1990.",
        "User was born on March 12th, 1990.",
        "User's home server IP address is 192.168.10.24.",
        "User's VPN endpoint is 2001:db8::ff00:42:8329.",
    ],
)
def test_dates_of_birth_and_ip_addresses_are_not_stored(
    client: memlane.Client, user_id: str, text: str
) -> None:
    with pytest.raises(memlane.InvalidArgumentError, match="personal data"):
        client.create_memory(caller=caller(user_id), kind=mpb.MEMORY_KIND_FACT, content=text)
    assert client.list_memories(caller=caller(user_id)).memories == []
    # Control: the same user's ordinary fact, with a birthday month and a version number, is stored.
    ok = client.create_memory(
        caller=caller(user_id),
        kind=mpb.MEMORY_KIND_FACT,
        content="User celebrates in March and runs version 1.2.3.",
    )
    assert ok.memory.memory_id


def test_episodes_redact_birth_dates_and_addresses(client: memlane.Client, user_id: str) -> None:
    out = client.extract_memories(
        caller=caller(user_id),
        session_id="pii-1",
        include_episodes=True,
        messages=[_turn("p1", "My date of birth is 12 March 1990 and my laptop's IP is 10.20.30.40 today.")],
    )
    episodes = [m.memory for m in out.memories if m.memory.kind == mpb.MEMORY_KIND_EPISODIC]
    assert len(episodes) == 1
    content = episodes[0].content
    assert "[DATE_OF_BIRTH]" in content and "[IP_ADDRESS]" in content
    assert "1990" not in content and "10.20.30.40" not in content
    assert not any(m.memory.kind == mpb.MEMORY_KIND_FACT for m in out.memories)


def test_memory_lists_maps_and_times_are_bounded(client: memlane.Client, user_id: str) -> None:
    many = {f"k{i}": "v" for i in range(65)}
    with pytest.raises(memlane.InvalidArgumentError, match="metadata has 65 entries"):
        client.create_memory(
            caller=caller(user_id), kind=mpb.MEMORY_KIND_FACT, content="User rows.", metadata=many
        )
    with pytest.raises(memlane.InvalidArgumentError, match=r"keywords\[0\] is longer"):
        client.create_memory(
            caller=caller(user_id), kind=mpb.MEMORY_KIND_FACT, content="User rows.", keywords=["k" * 2000]
        )
    with pytest.raises(memlane.InvalidArgumentError, match=r"occurred_at_unix_ms .* outside"):
        client.create_memory(
            caller=caller(user_id),
            kind=mpb.MEMORY_KIND_FACT,
            content="User rows.",
            occurred_at_unix_ms=253_402_300_800_000,
        )
    with pytest.raises(memlane.InvalidArgumentError, match=r"messages\[0\]\.tool_call_ids has 300"):
        client.extract_memories(
            caller=caller(user_id),
            messages=[
                spb.Message(role=spb.ROLE_USER, content="I row.", tool_call_ids=[str(i) for i in range(300)])
            ],
        )
    made = client.create_memory(
        caller=caller(user_id),
        kind=mpb.MEMORY_KIND_FACT,
        content="User rows.",
        metadata=dict(list(many.items())[:64]),
    ).memory
    with pytest.raises(memlane.InvalidArgumentError, match=r"memory\.metadata has 65"):
        client.update_memory(
            caller=caller(user_id),
            memory=mpb.Memory(memory_id=made.memory_id, metadata=many),
            update_mask=FieldMask(paths=["metadata"]),
        )
    assert len(client.get_memory(caller=caller(user_id), memory_id=made.memory_id).memory.metadata) == 64
