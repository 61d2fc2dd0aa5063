"""What the model is shown (issue 31), through the real server: the newest value of an attribute wins
whatever slot names and write paths its items came by; each memory and each text reaches a context
once; episodes are kept when they can answer something later; weak hits are left out of assembly."""

from __future__ import annotations

import uuid

import pytest

import memlane
from memlane.v1 import context_pb2 as cpb
from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import session_pb2 as spb
from tests.integration.test_memory_quality import _DURABLE, _assemble, _memories, _talk, _user, _who

R = mpb.MemoryChangeReason


def _texts(block: cpb.ContextBlock | None) -> str:
    return "\n".join(m.content for m in block.messages) if block is not None else ""


# ------------------------------------------------------------------------ the newest fact across names


@pytest.mark.parametrize("slot", ["home_city", "City", "lives-in", ""])
def test_a_home_said_later_wins_over_the_extracted_one_whatever_its_slot_name(
    client: memlane.Client, slot: str
) -> None:
    user = _user()
    _talk(client, user, ["I live in Berlin."])  # the rule extractor: slot "location"
    [berlin] = [m for m in _memories(client, user, _DURABLE) if "Berlin" in m.content]
    employer = client.create_memory(
        caller=_who(user), kind=mpb.MEMORY_KIND_FACT, content="Works at Acme.", slot="company"
    ).memory
    munich = client.create_memory(
        caller=_who(user), kind=mpb.MEMORY_KIND_FACT, content="Lives in Munich.", slot=slot
    ).memory
    assert munich.slot == "location"
    active = sorted(m.content for m in _memories(client, user, _DURABLE))
    # Positive control: another attribute (employer, named "company") is not touched.
    assert active == ["Lives in Munich.", "Works at Acme."], active
    assert employer.slot == "employer"
    old = next(m for m in _memories(client, user, _DURABLE, retired=True) if m.memory_id == berlin.memory_id)
    assert old.superseded_by == munich.memory_id
    versions = client.list_memory_versions(caller=_who(user), memory_id=berlin.memory_id).versions
    assert versions[-1].reason == R.MEMORY_CHANGE_REASON_SUPERSEDE
    assert versions[-1].memory.superseded_by == munich.memory_id

    sid = client.create_session(user_id=user, agent_id="agent-q").session.session_id
    blocks, _ = _assemble(client, sid, "where do I live?")
    shown = _texts(blocks.get(cpb.PROVENANCE_PROFILE)) + _texts(blocks.get(cpb.PROVENANCE_MEMORY))
    assert "Munich" in shown and "Lives in Berlin" not in shown and "User lives in Berlin" not in shown


def test_a_move_said_in_a_session_supersedes_a_remembered_home(client: memlane.Client) -> None:
    user = _user()
    before = client.create_memory(
        caller=_who(user), kind=mpb.MEMORY_KIND_FACT, content="The user lives in Berlin.", slot="address"
    ).memory
    _talk(client, user, ["I moved to Munich last month."])
    active = [m.content for m in _memories(client, user, _DURABLE)]
    assert active == ["User lives in Munich."], active
    old = next(m for m in _memories(client, user, _DURABLE, retired=True) if m.memory_id == before.memory_id)
    assert old.superseded_by


def test_the_profile_shows_one_home_when_two_agents_wrote_one_each(client: memlane.Client) -> None:
    user = _user()
    _talk(client, user, ["I live in Berlin."])  # agent-q, user-wide
    other = mpb.Caller(user_id=user, agent_id="agent-other")
    client.create_memory(
        caller=other,
        kind=mpb.MEMORY_KIND_FACT,
        content="Lives in Munich.",
        slot="home_city",
        scope=mpb.MEMORY_SCOPE_USER,
    )
    client.create_memory(
        caller=other, kind=mpb.MEMORY_KIND_FACT, content="Has a cat named Miso.", scope=mpb.MEMORY_SCOPE_USER
    )
    sid = client.create_session(user_id=user, agent_id="agent-other").session.session_id
    blocks, _ = _assemble(client, sid, "tell me about myself")
    profile = _texts(blocks.get(cpb.PROVENANCE_PROFILE))
    assert "Munich" in profile and "Berlin" not in profile, profile
    assert "Miso" in profile  # positive control: an unslotted fact of either agent is kept


# ------------------------------------------------------------------------ each memory once


def test_one_text_reaches_search_and_the_context_once(client: memlane.Client) -> None:
    user = _user()
    said = "My order 4400 was delivered to the wrong address in Leipzig."
    for other in ("I also asked about the refund for order 4400.", "The courier for order 4400 was late."):
        _talk(client, user, [said, other])
    _talk(client, user, [said])
    # Three sessions of one day, the same words: one memory whose provenance is all three turns.
    [stored] = [m for m in _memories(client, user) if "wrong address" in m.content]
    assert len(stored.source_message_ids) == 3, stored

    hits = client.search_memories(caller=_who(user), query="order 4400 wrong address", limit=10).results
    texts = [h.memory.content for h in hits]
    assert len(texts) == len(set(texts)), texts
    # Positive control: the two other turns about the order are still found.
    assert any("refund" in t for t in texts) and any("courier" in t for t in texts), texts

    sid = client.create_session(user_id=user, agent_id="agent-q").session.session_id
    blocks, _ = _assemble(client, sid, "what happened with order 4400?")
    lines = [ln for ln in _texts(blocks.get(cpb.PROVENANCE_MEMORY)).splitlines() if ln.startswith("- ")]
    assert len(lines) == len(set(lines)) and sum("wrong address" in ln for ln in lines) == 1, lines
    assert any("refund" in ln for ln in lines) and any("courier" in ln for ln in lines), lines


def test_one_fact_written_by_two_agents_is_in_the_profile_once(client: memlane.Client) -> None:
    user = _user()
    for agent in ("agent-q", "agent-other"):
        client.create_memory(
            caller=mpb.Caller(user_id=user, agent_id=agent),
            kind=mpb.MEMORY_KIND_FACT,
            content="Has a cat named Miso.",
            scope=mpb.MEMORY_SCOPE_USER,
        )
    client.create_memory(caller=_who(user), kind=mpb.MEMORY_KIND_FACT, content="Plays the cello.")
    sid = client.create_session(user_id=user, agent_id="agent-q").session.session_id
    blocks, _ = _assemble(client, sid, "what pets do I have?")
    shown = _texts(blocks.get(cpb.PROVENANCE_PROFILE)) + _texts(blocks.get(cpb.PROVENANCE_MEMORY))
    assert shown.count("Miso") == 1 and "cello" in shown, shown


# ------------------------------------------------------------------------ episodes worth keeping


def test_assistant_boilerplate_and_echoes_are_not_episodes_but_what_it_states_is(
    client: memlane.Client,
) -> None:
    user = _user()
    sid = f"s-{uuid.uuid4().hex[:10]}"
    client.create_session(session_id=sid, user_id=user, agent_id="agent-q")
    exchange = [
        (spb.ROLE_USER, "I need a flight from Berlin to Lisbon next Tuesday morning."),
        (spb.ROLE_ASSISTANT, "Sure, I can help with that!"),
        (spb.ROLE_ASSISTANT, "Let me check."),
        (spb.ROLE_ASSISTANT, "You need a flight from Berlin to Lisbon on Tuesday morning, got it."),
        (spb.ROLE_ASSISTANT, "I booked the 9:40 TAP flight; your booking number is BK-88213."),
        (spb.ROLE_USER, "Great. Please add a window seat."),
        (spb.ROLE_ASSISTANT, "Of course! Let me look into that for you."),
        (spb.ROLE_ASSISTANT, "Done: seat 14A is reserved, and the fare includes one checked bag."),
    ]
    client.append_messages(
        session_id=sid,
        messages=[
            spb.Message(message_id=f"{sid}-m{i}", role=role, content=text)
            for i, (role, text) in enumerate(exchange)
        ],
    )
    client.promote_session(session_id=sid, close=True, timeout=120)
    episodes = [m.content for m in _memories(client, user, [mpb.MEMORY_KIND_EPISODIC])]
    joined = "\n".join(episodes)
    for boilerplate in ("help with that", "Let me check", "got it", "look into that"):
        assert boilerplate not in joined, episodes
    # What the assistant stated that the user did not: kept, and found by what it states.
    assert "BK-88213" in joined and "14A" in joined, episodes
    assert "Berlin to Lisbon next Tuesday" in joined and "window seat" in joined, episodes
    assert len(episodes) == 4, episodes
    hits = client.search_memories(caller=_who(user), query="booking number", limit=3).results
    assert "BK-88213" in hits[0].memory.content


# ------------------------------------------------------------------------ weak hits left out


def test_assembly_leaves_out_a_memory_that_only_weakly_resembles_the_request(client: memlane.Client) -> None:
    user = _user()
    for text in (
        "[2 May 2024] User: my dog Rex chewed both of my slippers last night.",
        "[3 May 2024] User: I switched my editor to Vim keybindings this week.",
    ):
        client.create_memory(caller=_who(user), kind=mpb.MEMORY_KIND_EPISODIC, content=text)
    sid = client.create_session(user_id=user, agent_id="agent-q").session.session_id

    # Nothing of the request is in the dog's episode, and its meaning is far: left out, and the trace says so.
    blocks, stats = _assemble(client, sid, "which keybindings does my editor use?")
    shown = _texts(blocks.get(cpb.PROVENANCE_MEMORY))
    assert "Vim" in shown and "Rex" not in shown, shown
    assert any("relevance floor" in t.reason for t in stats.truncations), stats.truncations
    # SearchMemories without min_score still lists it (the floor is assembly's).
    hits = client.search_memories(caller=_who(user), query="which keybindings does my editor use?", limit=5)
    assert any("Rex" in h.memory.content for h in hits.results)

    # Positive controls: a paraphrase with no shared word, and a shared word, are both injected.
    for request in ("any news about my pets?", "what did the dog chew?"):
        blocks, _ = _assemble(client, sid, request)
        assert "Rex" in _texts(blocks.get(cpb.PROVENANCE_MEMORY)), request
