"""MemoryService through the real gRPC server and the real client (typed errors included)."""

from __future__ import annotations

import uuid

import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from hypothesis import HealthCheck, assume, given, settings

import memlane
from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import session_pb2 as spb
from memlane_server.ids import normalized
from tests.hostile import valid_ids


@pytest.fixture(scope="module")
def api(client: memlane.Client) -> memlane.Client:
    return client


def caller(user: str, agent: str = "agent-a") -> mpb.Caller:
    return mpb.Caller(user_id=user, agent_id=agent)


def user_msg(mid: str, text: str) -> spb.Message:
    return spb.Message(message_id=mid, role=spb.ROLE_USER, content=text)


def test_told_in_one_session_recalled_in_the_next(api: memlane.Client, user_id: str) -> None:
    api.extract_memories(
        caller=caller(user_id),
        session_id="s1",
        messages=[
            user_msg("m1", "Hi! I live in Bangalore and I prefer metric units."),
            spb.Message(message_id="m2", role=spb.ROLE_ASSISTANT, content="Noted!"),
        ],
        include_episodes=True,
    )
    out = api.extract_memories(
        caller=caller(user_id),
        session_id="s2",
        messages=[user_msg("m7", "I moved to Pune. From now on, use imperial units.")],
    )
    assert {m.outcome for m in out.memories} == {mpb.INGEST_OUTCOME_SUPERSEDED}
    hits = api.search_memories(caller=caller(user_id), query="Where does the user live?", limit=3).results
    assert hits[0].memory.content == "User lives in Pune."
    assert hits[0].parts.final == pytest.approx(hits[0].score)
    profile = api.get_profile(caller=caller(user_id))
    texts = [m.content for m in [*profile.instructions, *profile.preferences, *profile.facts]]
    assert "From now on: use imperial units." in texts and "User lives in Pune." in texts
    assert "User prefers metric units." not in texts and "User lives in Bangalore." not in texts


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=valid_ids(), b=valid_ids())
def test_users_never_see_each_others_items(api: memlane.Client, a: str, b: str) -> None:
    # Ids are stored in NFC (memlane_server.ids.normalized): U+F900 is U+8C48's user, and answers carry
    # the stored form. Two ids that normalize alike are one user.
    a, b = normalized(a), normalized(b)
    assume(a != b)
    tag = uuid.uuid4().hex[:8]
    query = f"parrot Kiwi {tag}"
    made = api.create_memory(
        caller=caller(a), kind=mpb.MEMORY_KIND_FACT, content=f"User keeps a parrot named Kiwi {tag}."
    ).memory
    # Positive control: the same search and listing find the item for its owner.
    own = api.search_memories(caller=caller(a), query=query, limit=20).results
    assert made.memory_id in [r.memory.memory_id for r in own]
    assert all(r.memory.user_id == a for r in own)
    owned = api.list_memories(caller=mpb.Caller(user_id=a), page_size=500).memories
    assert made.memory_id in [m.memory_id for m in owned]
    for who in (caller(b), caller(b, ""), caller(b + "' OR '1'='1")):
        res = api.search_memories(caller=who, query=query, limit=20).results
        assert made.memory_id not in [r.memory.memory_id for r in res]
        assert all(r.memory.user_id == who.user_id for r in res)
        listed = api.list_memories(caller=mpb.Caller(user_id=who.user_id), page_size=500).memories
        assert made.memory_id not in [m.memory_id for m in listed]
        assert all(m.user_id == who.user_id for m in listed)


def test_agent_and_group_memories_reach_only_their_agents(api: memlane.Client, user_id: str) -> None:
    tag = uuid.uuid4().hex[:8]
    writer = mpb.Caller(user_id=user_id, agent_id="agent-a", groups=["ops"])
    private = api.create_memory(
        caller=writer, kind=mpb.MEMORY_KIND_FACT, scope=mpb.MEMORY_SCOPE_AGENT, content=f"Locker word {tag}."
    ).memory
    grouped = api.create_memory(
        caller=writer,
        kind=mpb.MEMORY_KIND_FACT,
        scope=mpb.MEMORY_SCOPE_GROUP,
        group="ops",
        content=f"Team locker word {tag}.",
    ).memory

    def found(who: mpb.Caller) -> set[str]:
        hits = api.search_memories(caller=who, query=f"locker word {tag}", limit=20).results
        return {r.memory.memory_id for r in hits} & {private.memory_id, grouped.memory_id}

    # Positive control: the writer finds both with the same query.
    assert found(writer) == {private.memory_id, grouped.memory_id}
    assert found(mpb.Caller(user_id=user_id, agent_id="agent-b", groups=["ops"])) == {grouped.memory_id}
    assert found(mpb.Caller(user_id=user_id, agent_id="agent-b")) == set()
    assert found(mpb.Caller(user_id=user_id, agent_id="agent-a")) == {private.memory_id}


def test_merge_crud_feedback(api: memlane.Client, user_id: str) -> None:
    first = api.create_memory(
        caller=caller(user_id), kind=mpb.MEMORY_KIND_PREFERENCE, content="User likes green tea."
    )
    again = api.create_memory(
        caller=caller(user_id), kind=mpb.MEMORY_KIND_PREFERENCE, content="The user likes green tea"
    )
    assert again.outcome == mpb.INGEST_OUTCOME_MERGED and again.memory.memory_id == first.memory.memory_id
    mid = first.memory.memory_id
    api.record_feedback(caller=caller(user_id), memory_id=mid, verdict=mpb.FEEDBACK_VERDICT_USEFUL)
    got = api.get_memory(caller=caller(user_id), memory_id=mid).memory
    assert got.useful_count == 1 and got.usage_count == 1
    api.update_memory(
        caller=caller(user_id),
        memory=mpb.Memory(memory_id=mid, content="User likes jasmine tea."),
        update_mask=FieldMask(paths=["content"]),
    )
    assert api.get_memory(caller=caller(user_id), memory_id=mid).memory.content == "User likes jasmine tea."
    found = api.search_memories(caller=caller(user_id), query="jasmine tea").results
    assert [r.memory.memory_id for r in found] == [mid]  # positive control for the search below
    api.record_feedback(caller=caller(user_id), memory_id=mid, verdict=mpb.FEEDBACK_VERDICT_WRONG)
    assert api.search_memories(caller=caller(user_id), query="jasmine tea").results == []
    api.delete_memory(caller=caller(user_id), memory_id=mid)
    with pytest.raises(memlane.NotFoundError):
        api.get_memory(caller=caller(user_id), memory_id=mid)
    with pytest.raises(memlane.InvalidArgumentError):
        api.update_memory(
            caller=caller(user_id), memory=mpb.Memory(memory_id=mid), update_mask=FieldMask(paths=["user_id"])
        )


def test_pii_rejected_and_listing_pages(api: memlane.Client, user_id: str) -> None:
    with pytest.raises(memlane.InvalidArgumentError):
        api.create_memory(
            caller=caller(user_id), kind=mpb.MEMORY_KIND_FACT, content="User's card is 4111 1111 1111 1111"
        )
    with pytest.raises(memlane.InvalidArgumentError):
        api.search_memories(caller=mpb.Caller(), query="x")
    out = api.extract_memories(
        caller=caller(user_id), messages=[user_msg("p1", "My email is a@b.io and I love it.")]
    )
    assert out.memories == [] and out.rejected_pii == 1
    for i in range(5):
        api.create_memory(
            caller=caller(user_id), kind=mpb.MEMORY_KIND_FACT, content=f"User visited Town{i} in {2010 + i}."
        )
    seen, token = [], ""
    while True:
        page = api.list_memories(caller=caller(user_id), page_size=2, page_token=token)
        seen += [m.memory_id for m in page.memories]
        token = page.next_page_token
        if not token:
            break
    assert len(seen) == len(set(seen)) == 5 and page.total_size == 5


def test_the_same_words_for_another_audience_are_a_separate_memory(api: memlane.Client, user_id: str) -> None:
    """A merge keeps its readers: a group fact worded like the writer's private one must not be folded
    into it (the group would never see it), nor a private one into a group or user-wide item."""
    writer = mpb.Caller(user_id=user_id, agent_id="agent-a", groups=["ops"])
    words = f"The locker code word is tulip-{uuid.uuid4().hex[:6]}."
    private = api.create_memory(
        caller=writer, kind=mpb.MEMORY_KIND_FACT, scope=mpb.MEMORY_SCOPE_AGENT, content=words
    ).memory
    # Positive control: the same words for the same audience are one memory (merged).
    again = api.create_memory(
        caller=writer, kind=mpb.MEMORY_KIND_FACT, scope=mpb.MEMORY_SCOPE_AGENT, content=words
    ).memory
    assert again.memory_id == private.memory_id
    grouped = api.create_memory(
        caller=writer, kind=mpb.MEMORY_KIND_FACT, scope=mpb.MEMORY_SCOPE_GROUP, group="ops", content=words
    ).memory
    wide = api.create_memory(
        caller=writer, kind=mpb.MEMORY_KIND_FACT, scope=mpb.MEMORY_SCOPE_USER, content=words
    )
    assert len({private.memory_id, grouped.memory_id, wide.memory.memory_id}) == 3
    member = mpb.Caller(user_id=user_id, agent_id="agent-b", groups=["ops"])
    hits = {r.memory.memory_id for r in api.search_memories(caller=member, query=words, limit=20).results}
    assert hits == {grouped.memory_id, wide.memory.memory_id}


def test_an_edit_of_the_text_drops_the_keywords_it_no_longer_says(api: memlane.Client, user_id: str) -> None:
    """Keywords are keys derived from the text: after the text is edited, a key it no longer holds must not
    keep finding the item (nor steer its vector); one it still holds stays, and keywords the edit names
    itself are taken as given."""
    made = api.create_memory(
        caller=caller(user_id),
        kind=mpb.MEMORY_KIND_FACT,
        content="User lives in Munich, in a rented flat.",
        keywords=["Munich", "rented flat"],
    ).memory
    assert [
        r.memory.memory_id for r in api.search_memories(caller=caller(user_id), query="Munich").results
    ] == [made.memory_id]  # positive control: the keyword finds it before the edit
    api.update_memory(
        caller=caller(user_id),
        memory=mpb.Memory(memory_id=made.memory_id, content="User lives in Berlin, in a rented flat."),
        update_mask=FieldMask(paths=["content"]),
    )
    got = api.get_memory(caller=caller(user_id), memory_id=made.memory_id).memory
    assert list(got.keywords) == ["rented flat"]
    hits = api.search_memories(caller=caller(user_id), query="Munich", mode=mpb.SEARCH_MODE_KEYWORD).results
    assert made.memory_id not in [r.memory.memory_id for r in hits]
    api.update_memory(
        caller=caller(user_id),
        memory=mpb.Memory(memory_id=made.memory_id, content="User lives in Hamburg.", keywords=["Elbe"]),
        update_mask=FieldMask(paths=["content", "keywords"]),
    )
    assert list(api.get_memory(caller=caller(user_id), memory_id=made.memory_id).memory.keywords) == ["Elbe"]


def test_a_search_naming_no_agent_covers_what_the_plain_list_shows(api: memlane.Client, user_id: str) -> None:
    """A caller naming no agent reads the user's whole memory (the viewer, `memories list`): its search
    must find the agent-private items its listing shows, while each agent's own search stays its own."""
    note = api.create_memory(
        caller=caller(user_id, "agent-a"),
        kind=mpb.MEMORY_KIND_INSTRUCTION,
        content="Quote the Lisbon office code 7731 on every invoice.",
        scope=mpb.MEMORY_SCOPE_AGENT,
    ).memory
    whole = mpb.Caller(user_id=user_id)
    assert note.memory_id in [m.memory_id for m in api.list_memories(caller=whole).memories]

    def found(who: mpb.Caller) -> list[str]:
        return [
            r.memory.memory_id for r in api.search_memories(caller=who, query="Lisbon office code").results
        ]

    assert note.memory_id in found(whole)
    assert note.memory_id in found(caller(user_id, "agent-a"))  # positive control: its own agent finds it
    assert note.memory_id not in found(caller(user_id, "agent-b"))  # and another agent still does not
