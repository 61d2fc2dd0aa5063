"""Memory quality through the real server (issue 24): one fact held once and injected once, the newest
value wins, filler is not remembered, every extracted fact says whose it is and when.

Each case drives the public client only: CreateMemory, sessions promoted by the session-end pipeline,
AssembleContext with its turn trace, ListMemories (with retired items for the supersede chain).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

import memlane
from memlane.v1 import context_pb2 as cpb
from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import session_pb2 as spb

AGENT = "agent-q"
_DURABLE = [mpb.MEMORY_KIND_FACT, mpb.MEMORY_KIND_PREFERENCE, mpb.MEMORY_KIND_INSTRUCTION]


def _user() -> str:
    return f"u-{uuid.uuid4().hex[:10]}"


def _who(user: str) -> mpb.Caller:
    return mpb.Caller(user_id=user, agent_id=AGENT)


def _ms(day: str) -> int:
    return int(dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC).timestamp() * 1000)


def _talk(
    client: memlane.Client,
    user: str,
    turns: Sequence[str | tuple[str, str]],
    *,
    day: str = "2024-03-04T10:00:00",
    participants: Sequence[str] = (),
    agent: str = AGENT,
) -> str:
    """One session of ``agent``'s user turns (text, or (speaker, text)), closed and promoted; its id."""
    sid = f"s-{uuid.uuid4().hex[:10]}"
    client.create_session(session_id=sid, user_id=user, agent_id=agent, participants=list(participants))
    at = _ms(day)
    messages = []
    for i, turn in enumerate(turns):
        name, text = turn if isinstance(turn, tuple) else ("", turn)
        messages.append(
            spb.Message(
                message_id=f"{sid}-m{i}",
                role=spb.ROLE_USER,
                participant_name=name,
                content=text,
                created_at_unix_ms=at + i * 1000,
            )
        )
    client.append_messages(session_id=sid, messages=messages)
    state = client.promote_session(session_id=sid, close=True, timeout=120).session.promotion_state
    assert state in (spb.PROMOTION_STATE_PROMOTED, spb.PROMOTION_STATE_ARCHIVED)
    return sid


def _memories(
    client: memlane.Client,
    user: str,
    kinds: Sequence[mpb.MemoryKind.ValueType] = (),
    *,
    retired: bool = False,
) -> list[mpb.Memory]:
    flt = mpb.MemoryFilter(kinds=list(kinds), include_retired=retired)
    return list(client.list_memories(caller=_who(user), filter=flt, page_size=500).memories)


def _assemble(
    client: memlane.Client, sid: str, query: str, **fields: Any
) -> tuple[dict[int, cpb.ContextBlock], cpb.AssembleStats]:
    blocks: dict[int, cpb.ContextBlock] = {}
    stats: cpb.AssembleStats | None = None
    for part in client.assemble_context(session_id=sid, user_input=query, **fields):
        for block in part.blocks:
            blocks[block.provenance] = block
        if part.HasField("stats"):
            stats = part.stats
    assert stats is not None
    return blocks, stats


def _ids(block: cpb.ContextBlock | None) -> list[str]:
    return [m.memory_id for m in block.memories] if block is not None else []


# ------------------------------------------------------------------------ one injection once


def test_an_item_in_the_profile_is_not_repeated_in_the_memory_block(client: memlane.Client) -> None:
    user = _user()
    facts = [
        "User keeps bees on the roof of the house.",
        "User sells the honey from the bees at the Saturday market.",
        "User's bees are Carniolan honey bees.",
    ]
    for text in facts:
        client.create_memory(caller=_who(user), kind=mpb.MEMORY_KIND_FACT, content=text)
    episodes = [
        "[2 May 2024] User: the bees swarmed twice this spring and I caught both swarms.",
        "[9 May 2024] User: I harvested forty jars of honey from the bees this week.",
        "[16 May 2024] User: a neighbour complained that the bees drink from her pond.",
    ]
    for text in episodes:
        client.create_memory(caller=_who(user), kind=mpb.MEMORY_KIND_EPISODIC, content=text)
    sid = client.create_session(user_id=user, agent_id=AGENT).session.session_id
    query = "what is going on with the user's bees and honey?"

    # Positive control: without the profile section the three facts are what recall ranks first.
    blocks, _ = _assemble(client, sid, query, memory_limit=3, omit=[cpb.PROVENANCE_PROFILE])
    recalled_alone = _ids(blocks.get(cpb.PROVENANCE_MEMORY))
    assert len(recalled_alone) == 3

    blocks, stats = _assemble(client, sid, query, memory_limit=3)
    profile = _ids(blocks.get(cpb.PROVENANCE_PROFILE))
    memory = _ids(blocks.get(cpb.PROVENANCE_MEMORY))
    assert len(profile) == 3
    assert not set(profile) & set(memory), "a profile item was injected twice"
    # The freed slots went to the next items: the three episodes, within the same memory_limit.
    texts = {m.content for m in blocks[cpb.PROVENANCE_MEMORY].messages}
    assert len(memory) == 3 and all(e in next(iter(texts)) for e in episodes)
    rule = [t for t in stats.truncations if t.section == cpb.CONTEXT_SECTION_MEMORY]
    assert any("already in the profile" in t.reason and t.items_removed >= 1 for t in rule), rule
    trace = client.get_turn_trace(session_id=sid, trace_id=stats.trace_id).trace
    assert any("already in the profile" in t.reason for t in trace.stats.truncations)


# ------------------------------------------------------------------------ one fact once


def test_a_remembered_fact_and_the_same_fact_said_later_are_one_item(client: memlane.Client) -> None:
    user = _user()
    remembered = client.create_memory(
        caller=_who(user), kind=mpb.MEMORY_KIND_FACT, content="Lives in Lyon, France."
    ).memory
    sid = _talk(client, user, ["Hi!", "I live in Lyon, it is lovely in spring."])

    lyon = [m for m in _memories(client, user, _DURABLE) if "Lyon" in m.content]
    assert len(lyon) == 1, [m.content for m in lyon]
    merged = lyon[0]
    # Provenance of every source: the explicit memory's id stays, the turn is named.
    assert merged.memory_id == remembered.memory_id
    assert f"{sid}-m1" in merged.source_message_ids
    assert merged.slot == "location"


def test_the_same_words_from_two_people_stay_two_facts(client: memlane.Client) -> None:
    user = _user()
    _talk(
        client,
        user,
        [("Ana", "I live in Lyon now."), ("Ben", "I live in Porto.")],
        participants=["Ana", "Ben"],
    )
    facts = [m.content for m in _memories(client, user, _DURABLE)]
    # Each extracted fact names whose it is, and Ben's city does not retire Ana's.
    assert "Ana lives in Lyon." in facts and "Ben lives in Porto." in facts, facts
    _talk(client, user, [("Ben", "I live in Porto, by the river.")], participants=["Ana", "Ben"])
    facts = [m.content for m in _memories(client, user, _DURABLE)]
    assert "Ana lives in Lyon." in facts and sum("Porto" in f for f in facts) == 1, facts


def test_an_explicit_memory_for_an_agent_does_not_merge_into_a_user_wide_fact(
    client: memlane.Client,
) -> None:
    user = _user()
    _talk(client, user, ["I live in Lyon."])
    client.create_memory(
        caller=_who(user),
        kind=mpb.MEMORY_KIND_FACT,
        content="Lives in Lyon, France.",
        scope=mpb.MEMORY_SCOPE_AGENT,
    )
    lyon = [m for m in _memories(client, user, _DURABLE) if "Lyon" in m.content]
    assert len(lyon) == 2 and {m.scope for m in lyon} == {mpb.MEMORY_SCOPE_USER, mpb.MEMORY_SCOPE_AGENT}


# ------------------------------------------------------------------------ the newest wins


def test_a_changed_unit_preference_supersedes_the_old_one(client: memlane.Client) -> None:
    user = _user()
    _talk(client, user, ["I prefer answers in metric units."], day="2024-03-04T10:00:00")
    first = [m for m in _memories(client, user, _DURABLE) if "metric" in m.content]
    assert len(first) == 1  # positive control: the first preference is extracted

    _talk(client, user, ["I now prefer answers in imperial units."], day="2024-04-04T10:00:00")
    active = [m.content for m in _memories(client, user, _DURABLE)]
    assert any("imperial" in c for c in active) and not any("metric" in c for c in active), active
    old = next(
        m for m in _memories(client, user, _DURABLE, retired=True) if m.memory_id == first[0].memory_id
    )
    assert old.superseded_by and old.valid_until_unix_ms > 0


def test_a_new_value_worded_differently_supersedes_by_meaning(client: memlane.Client) -> None:
    user = _user()
    _talk(client, user, ["I prefer answers in metric units."])
    # No slot and no phrase the extractor knows: an explicit instruction that states the same attribute.
    new = client.create_memory(
        caller=_who(user),
        kind=mpb.MEMORY_KIND_INSTRUCTION,
        content="Use the imperial system for all measurements.",
        scope=mpb.MEMORY_SCOPE_USER,  # for every agent, as the preference it replaces
    ).memory
    active = [m.content for m in _memories(client, user, _DURABLE)]
    assert active == [new.content], active
    old = next(m for m in _memories(client, user, _DURABLE, retired=True) if "metric" in m.content)
    assert old.superseded_by == new.memory_id


def test_an_episode_carrying_a_superseded_fact_is_down_ranked(client: memlane.Client) -> None:
    user = _user()
    _talk(client, user, ["I live in Bangalore, near the lake."], day="2024-01-10T09:00:00")
    before = next(m for m in _memories(client, user, [mpb.MEMORY_KIND_EPISODIC]) if "Bangalore" in m.content)
    assert not before.metadata.get("superseded_fact")  # positive control: not stale while true
    _talk(client, user, ["I moved to Pune."], day="2024-02-10T09:00:00")
    active = [m.content for m in _memories(client, user, _DURABLE)]
    assert active == ["User lives in Pune."], active
    episode = next(m for m in _memories(client, user, [mpb.MEMORY_KIND_EPISODIC]) if "Bangalore" in m.content)
    fact = next(m for m in _memories(client, user, _DURABLE, retired=True) if "Bangalore" in m.content)
    assert episode.metadata.get("superseded_fact") == fact.memory_id
    hits = client.search_memories(caller=_who(user), query="where does the user live?", limit=5).results
    ranked = [h.memory.content for h in hits]
    assert "Pune" in ranked[0], ranked
    stale = next(h for h in hits if "Bangalore" in h.memory.content)
    assert stale.score < hits[0].score


def test_a_fact_retired_within_one_session_marks_its_episode(client: memlane.Client) -> None:
    user = _user()
    _talk(client, user, ["I live in Bangalore.", "Big news: I moved to Pune last month."])
    episodes = {m.content: m for m in _memories(client, user, [mpb.MEMORY_KIND_EPISODIC])}
    old = next(m for c, m in episodes.items() if "Bangalore" in c)
    new = next(m for c, m in episodes.items() if "Pune" in c)
    assert old.metadata.get("superseded_fact") and not new.metadata.get("superseded_fact")
    assert new.metadata.get("resolved_time") == "2024-02"  # said on 4 March 2024


def test_two_preferences_that_do_not_contradict_both_stay(client: memlane.Client) -> None:
    user = _user()
    _talk(client, user, ["I love hiking in the Alps.", "I really enjoy cooking Thai curries."])
    active = [m.content for m in _memories(client, user, _DURABLE)]
    assert any("hiking" in c for c in active) and any("curries" in c for c in active), active


# ------------------------------------------------------------------------ picky episodes


def test_filler_turns_stay_in_the_archive_but_are_not_memories(client: memlane.Client) -> None:
    user = _user()
    turns = [
        "Hey, how are you doing today?",
        "That's awesome!",
        "Wow, that sounds amazing!",
        "What about you?",
        "How was your weekend?",
        "I finished restoring the 1967 Vespa in my garage on Sunday.",
        "I finished restoring the 1967 Vespa in my garage on Sunday.",
    ]
    sid = _talk(client, user, turns)
    episodes = [m.content for m in _memories(client, user, [mpb.MEMORY_KIND_EPISODIC])]
    assert len(episodes) == 1 and "Vespa" in episodes[0], episodes
    # The archive keeps every turn.
    page = client.list_messages(session_id=sid, page_size=50)
    assert len(page.messages) == len(turns)


# ------------------------------------------------------------------------ attribution and time


def test_relative_times_are_resolved_against_the_session_date(client: memlane.Client) -> None:
    user = _user()
    _talk(
        client,
        user,
        [("Ana", "I ran my first marathon last May."), ("Ana", "My sister visited two weeks ago.")],
        day="2023-08-10T12:00:00",
        participants=["Ana"],
    )
    episodes = {m.content: m for m in _memories(client, user, [mpb.MEMORY_KIND_EPISODIC])}
    marathon = next(m for c, m in episodes.items() if "marathon" in c)
    visit = next(m for c, m in episodes.items() if "sister" in c)
    assert marathon.metadata.get("resolved_time") == "2023-05"
    assert "May 2023" in marathon.keywords
    assert visit.metadata.get("resolved_time") == "2023-07-27"
    assert "27 July 2023" in visit.keywords
    # The fact extracted names its speaker.
    facts = [m.content for m in _memories(client, user, _DURABLE)]
    assert all(not f.startswith("User ") for f in facts), facts


# ------------------------------------------------------------------------ assistant filler


SUPPORT_CHAT = [
    (spb.ROLE_USER, "Hi, I'd like to order a birthday cake for Saturday."),
    (spb.ROLE_ASSISTANT, "Certainly! What flavour would you like?"),
    (spb.ROLE_USER, "Chocolate, and no nuts please, my son is allergic."),
    (spb.ROLE_ASSISTANT, "Understood, no nuts will be included."),
    (spb.ROLE_USER, "Can you deliver it on Saturday morning?"),
    (spb.ROLE_ASSISTANT, "Yes, delivery is booked for Saturday at 10am, order number C-5521."),
    (spb.ROLE_USER, "Also no snacks in the box."),
    (spb.ROLE_ASSISTANT, "Understood, no snacks will be included."),
    (spb.ROLE_ASSISTANT, "Absolutely, that has been taken care of."),
    (spb.ROLE_ASSISTANT, "Perfect, your request has been updated accordingly."),
]


def test_a_support_chat_keeps_the_users_turns_and_the_assistants_that_add(client: memlane.Client) -> None:
    """An assistant's acknowledgement ("Understood, no snacks will be included.") says what the user's
    own turn already holds: no episode of its own. The assistant's turn with a booking (its order number,
    its time) is one, and so is every user turn."""
    user = _user()
    sid = f"s-{uuid.uuid4().hex[:10]}"
    client.create_session(session_id=sid, user_id=user, agent_id=AGENT)
    at = _ms("2024-03-04T10:00:00")
    client.append_messages(
        session_id=sid,
        messages=[
            spb.Message(message_id=f"{sid}-m{i}", role=role, content=text, created_at_unix_ms=at + i * 1000)
            for i, (role, text) in enumerate(SUPPORT_CHAT)
        ],
    )
    state = client.promote_session(session_id=sid, close=True, timeout=120).session.promotion_state
    assert state in (spb.PROMOTION_STATE_PROMOTED, spb.PROMOTION_STATE_ARCHIVED)
    episodes = [m.content for m in _memories(client, user, [mpb.MEMORY_KIND_EPISODIC])]
    spoken = [e.split("] ", 1)[1] for e in episodes]
    assistant = [s for s in spoken if s.startswith("Assistant:")]
    assert assistant == ["Assistant: " + SUPPORT_CHAT[5][1]], spoken
    users = [text for role, text in SUPPORT_CHAT if role == spb.ROLE_USER and not text.startswith("Hi,")]
    assert all(any(t in s for s in spoken) for t in users), spoken  # positive control: the user's turns
