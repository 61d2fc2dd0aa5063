"""One answer per fact across agents (issue 47, item 2), through the real server: a user-wide attribute
told to any agent supersedes the older value another agent holds, the newest said winning; the older
stays in the version history and out of every agent's context. The audience rule still bounds it: an
agent-private or group statement never retires what every agent reads, and two people's facts stay two.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import memlane
from memlane.v1 import context_pb2 as cpb
from memlane.v1 import memory_pb2 as mpb
from tests.integration.test_memory_quality import _DURABLE, _assemble, _ms, _talk, _user

A, B = "agent-a", "agent-b"
R = mpb.MemoryChangeReason


def _as(user: str, agent: str) -> mpb.Caller:
    return mpb.Caller(user_id=user, agent_id=agent)


def _talk_to(
    client: memlane.Client,
    user: str,
    agent: str,
    turns: Sequence[str | tuple[str, str]],
    *,
    day: str,
    participants: Sequence[str] = (),
) -> None:
    """One user-wide session of ``agent`` (turns: text, or (speaker, text)), closed and promoted."""
    _talk(client, user, turns, day=day, participants=participants, agent=agent)


def _facts(
    client: memlane.Client,
    caller: mpb.Caller,
    *,
    retired: bool = False,
    kinds: Sequence[mpb.MemoryKind.ValueType] = _DURABLE,
) -> list[mpb.Memory]:
    flt = mpb.MemoryFilter(kinds=list(kinds), include_retired=retired)
    return list(client.list_memories(caller=caller, filter=flt, page_size=500).memories)


def _shown(client: memlane.Client, user: str, agent: str, query: str) -> str:
    """What a new session of ``agent`` is shown of long-term memory: the profile and memory blocks."""
    sid = client.create_session(user_id=user, agent_id=agent).session.session_id
    blocks, _ = _assemble(client, sid, query)
    return "\n".join(
        m.content
        for p in (cpb.PROVENANCE_PROFILE, cpb.PROVENANCE_MEMORY)
        if (b := blocks.get(p)) is not None
        for m in b.messages
    )


def _one(memories: Sequence[mpb.Memory], word: str) -> mpb.Memory:
    [found] = [m for m in memories if word in m.content]
    return found


def test_a_move_told_to_one_agent_retires_the_home_another_agent_holds(client: memlane.Client) -> None:
    """Guards: B's newer user-wide "Berlin" retires A's user-wide "Munich" (on main both stayed active
    in slot ``location``, and A's and B's contexts showed Munich beside Berlin), with the supersede in
    Munich's history, Munich listed only among retired items and never found by search, and A's Munich
    episode marked stale and kept out of both contexts."""
    user = _user()
    _talk_to(client, user, A, ["I live in Munich."], day="2024-01-10T09:00:00")
    munich = _one(_facts(client, _as(user, A)), "Munich")
    assert munich.scope == mpb.MEMORY_SCOPE_USER and munich.slot == "location"
    # Positive control: before the move, both agents are shown Munich.
    for agent in (A, B):
        assert "Munich" in _shown(client, user, agent, "where do I live?")

    _talk_to(client, user, B, ["I moved to Berlin last week."], day="2024-03-04T10:00:00")
    berlin = _one(_facts(client, _as(user, B)), "Berlin")
    assert berlin.agent_id == B and berlin.slot == "location"
    for agent in (A, B):
        active = [m.content for m in _facts(client, _as(user, agent))]
        assert active == [berlin.content], (agent, active)
        shown = _shown(client, user, agent, "where do I live?")
        assert "Berlin" in shown and "Munich" not in shown, (agent, shown)

    old = _one(_facts(client, _as(user, A), retired=True), "Munich")
    assert old.memory_id == munich.memory_id and old.superseded_by == berlin.memory_id
    assert old.agent_id == A  # provenance kept: still A's item, from A's session
    versions = client.list_memory_versions(caller=_as(user, A), memory_id=munich.memory_id).versions
    assert versions[-1].reason == R.MEMORY_CHANGE_REASON_SUPERSEDE and versions[-1].changed_by == B
    assert versions[-1].memory.superseded_by == berlin.memory_id

    # Search serves active items only (include_retired is ListMemories' and GetMemory's, above).
    hits = client.search_memories(caller=_as(user, A), query="where does the user live?", limit=20).results
    found = {h.memory.memory_id for h in hits}
    assert berlin.memory_id in found and munich.memory_id not in found

    # A's Munich episode says what is no longer true: marked as a supersede by A itself marks it.
    episode = _one(_facts(client, _as(user, A), kinds=[mpb.MEMORY_KIND_EPISODIC]), "Munich")
    assert episode.metadata.get("superseded_fact") == munich.memory_id


def test_a_statement_said_before_another_agents_newer_value_does_not_win(client: memlane.Client) -> None:
    """Guards: newest *said* wins across agents, not newest learnt: B's session from January, promoted
    after A learnt of the March move, is stored retired by A's Berlin and does not bring Munich back."""
    user = _user()
    _talk_to(client, user, A, ["I moved to Berlin last week."], day="2024-03-04T10:00:00")
    berlin = _one(_facts(client, _as(user, A)), "Berlin")
    _talk_to(client, user, B, ["I live in Munich."], day="2024-01-10T09:00:00")
    for agent in (A, B):
        assert [m.content for m in _facts(client, _as(user, agent))] == [berlin.content], agent
    late = _one(_facts(client, _as(user, B), retired=True), "Munich")
    assert late.agent_id == B and late.superseded_by == berlin.memory_id

    # Positive control: the same late statement told by A itself wins, as it always has within an agent.
    _talk_to(client, user, A, ["I live in Hamburg."], day="2024-01-11T09:00:00")
    assert [m.content for m in _facts(client, _as(user, B))] == ["User lives in Hamburg."]


def test_an_agent_private_or_group_statement_does_not_retire_a_user_wide_home(client: memlane.Client) -> None:
    """Guards the audience rule across agents: B's agent-private or group note of another home must not
    rewrite what every agent reads (A's user-wide Munich stays active and in A's context)."""
    user = _user()
    _talk_to(client, user, A, ["I live in Munich."], day="2024-01-10T09:00:00")
    munich = _one(_facts(client, _as(user, A)), "Munich")
    for scope, group in ((mpb.MEMORY_SCOPE_AGENT, ""), (mpb.MEMORY_SCOPE_GROUP, "travel")):
        note = client.create_memory(
            caller=_as(user, B),
            kind=mpb.MEMORY_KIND_FACT,
            content="User lives in Berlin.",
            scope=scope,
            group=group,
        )
        assert note.memory.slot == "location" and not note.superseded_ids, scope
    assert munich.memory_id in {m.memory_id for m in _facts(client, _as(user, A))}
    assert "Munich" in _shown(client, user, A, "where do I live?")
    # Positive control: the same words user-wide do retire it.
    moved = client.create_memory(
        caller=_as(user, B),
        kind=mpb.MEMORY_KIND_FACT,
        content="User lives in Berlin.",
        scope=mpb.MEMORY_SCOPE_USER,
    ).memory
    old = _one(_facts(client, _as(user, A), retired=True), "Munich")
    assert old.superseded_by == moved.memory_id


def test_two_peoples_homes_told_to_two_agents_stay_two(client: memlane.Client) -> None:
    """Guards: across agents too, one person's attribute never retires another's (the subject rule)."""
    user = _user()
    people = ["Ana", "Ben"]
    _talk_to(
        client, user, A, [("Ana", "I live in Lyon now.")], day="2024-01-10T09:00:00", participants=people
    )
    _talk_to(client, user, B, [("Ben", "I live in Porto.")], day="2024-03-04T10:00:00", participants=people)
    for agent in (A, B):
        active = [m.content for m in _facts(client, _as(user, agent))]
        assert "Ana lives in Lyon." in active and "Ben lives in Porto." in active, active


def test_two_agents_told_two_homes_at_once_leave_one(client: memlane.Client) -> None:
    """Guards the locking: two agents' writes of one user's attribute at the same moment are decided one
    after the other (ingest locks per user, not per (user, agent)), so neither misses the other's and
    the newest said is the one answer, whichever landed first."""
    users = [_user() for _ in range(6)]
    said = {A: ("Lives in Munich.", "2024-01-10T09:00:00"), B: ("Lives in Berlin.", "2024-03-04T10:00:00")}
    start = threading.Barrier(len(users) * 2)

    def tell(user: str, agent: str) -> None:
        text, day = said[agent]
        start.wait()
        client.create_memory(
            caller=_as(user, agent),
            kind=mpb.MEMORY_KIND_FACT,
            content=text,
            scope=mpb.MEMORY_SCOPE_USER,
            occurred_at_unix_ms=_ms(day),
        )

    with ThreadPoolExecutor(len(users) * 2) as pool:
        for done in [pool.submit(tell, u, agent) for u in users for agent in (A, B)]:
            done.result()
    for user in users:
        assert [m.content for m in _facts(client, _as(user, A))] == ["Lives in Berlin."], user
        berlin = _one(_facts(client, _as(user, B)), "Berlin")
        assert _one(_facts(client, _as(user, A), retired=True), "Munich").superseded_by == berlin.memory_id


def test_a_context_leaves_out_an_episode_whose_fact_was_superseded(client: memlane.Client) -> None:
    """Guards: the episode that stated a retired value is not shown beside the new one (it was ranked
    lower only, and still filled a slot of "Relevant memories"); the trace names it. Search keeps it."""
    user = _user()
    _talk_to(client, user, A, ["I live in Bangalore, near the lake."], day="2024-01-10T09:00:00")
    episode = _one(_facts(client, _as(user, A), kinds=[mpb.MEMORY_KIND_EPISODIC]), "Bangalore")
    # Positive control: while true, the episode is recalled into the context.
    assert "near the lake" in _shown(client, user, A, "where do I live? near the lake?")
    _talk_to(client, user, A, ["I moved to Pune."], day="2024-02-10T09:00:00")
    sid = client.create_session(user_id=user, agent_id=A).session.session_id
    blocks, stats = _assemble(client, sid, "where do I live? near the lake?")
    shown = "\n".join(m.content for b in blocks.values() for m in b.messages)
    assert "Pune" in shown and "Bangalore" not in shown, shown
    [left] = [t for t in stats.truncations if "superseded fact" in t.reason]
    assert list(left.memory_ids) == [episode.memory_id]
    hits = client.search_memories(caller=_as(user, A), query="near the lake", limit=10).results
    assert episode.memory_id in {h.memory.memory_id for h in hits}


def test_a_preference_changed_with_another_agent_wins_however_it_is_worded(client: memlane.Client) -> None:
    """Guards: preferences too, and a new value whose slot only its meaning names (an explicit
    instruction, no slot given) meets another agent's stored one."""
    user = _user()
    _talk_to(client, user, A, ["I prefer answers in metric units."], day="2024-01-10T09:00:00")
    metric = _one(_facts(client, _as(user, A)), "metric")
    _talk_to(client, user, B, ["I now prefer answers in imperial units."], day="2024-03-04T10:00:00")
    imperial = _one(_facts(client, _as(user, A)), "imperial")
    assert _one(_facts(client, _as(user, A), retired=True), "metric").superseded_by == imperial.memory_id
    said = client.create_memory(
        caller=_as(user, A),
        kind=mpb.MEMORY_KIND_INSTRUCTION,
        content="Use the metric system for all measurements.",
        scope=mpb.MEMORY_SCOPE_USER,
    ).memory
    for agent in (A, B):
        assert [m.content for m in _facts(client, _as(user, agent))] == [said.content], agent
    assert metric.memory_id != said.memory_id
