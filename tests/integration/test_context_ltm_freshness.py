"""The wipe test: a long-term memory write takes effect on the very next assembly, on this sidecar and on
another one sharing the stores (same Redis and key prefix, same LanceDB). No sleeps: every assertion
is on the assembly right after the write returned, after a positive control that filled the caches."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from google.protobuf.field_mask_pb2 import FieldMask

import memlane
from memlane.v1 import context_pb2 as cpb
from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import session_pb2 as spb
from memlane_server.background import SidecarThread
from tests.conftest import ServerFactory

AGENT = "agent-a"


@pytest.fixture(scope="module")
def pair(
    start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[memlane.Client, memlane.Client]]:
    shared = {"key_prefix": f"t{uuid.uuid4().hex[:10]}", "ltm_uri": str(tmp_path_factory.mktemp("ltm"))}
    a, b = start_server(**shared), start_server(**shared)
    with memlane.Client(a.target, timeout=30) as ca, memlane.Client(b.target, timeout=30) as cb:
        yield ca, cb


def _who(user: str) -> mpb.Caller:
    return mpb.Caller(user_id=user, agent_id=AGENT)


def _seen(c: memlane.Client, sid: str, query: str) -> tuple[str, str]:
    """What the model sees: the profile block's text, and the recalled memories' text of an assembly
    without the profile section (with it, a memory in the profile is not repeated among the recalled
    ones, and recall's own freshness would go unchecked)."""
    profile = memories = ""
    for omit in ([], [cpb.PROVENANCE_PROFILE]):
        for part in c.assemble_context(session_id=sid, user_input=query, omit=omit):
            for block in part.blocks:
                text = "\n".join(m.content for m in block.messages)
                if block.provenance == cpb.PROVENANCE_PROFILE and not omit:
                    profile = text
                elif block.provenance == cpb.PROVENANCE_MEMORY and omit:
                    memories = text
    return profile, memories


def _setup(pair: tuple[memlane.Client, memlane.Client], content: str) -> tuple[str, str, str]:
    """A user with one preference, and a session of theirs; both sidecars have assembled it once."""
    a, b = pair
    user = f"u-{uuid.uuid4().hex[:8]}"
    mid = a.create_memory(
        caller=_who(user), kind=mpb.MEMORY_KIND_PREFERENCE, content=content
    ).memory.memory_id
    sid = a.create_session(user_id=user, agent_id=AGENT).session.session_id
    for c in (a, b):  # positive control on both sidecars; this also fills their caches
        profile, memories = _seen(c, sid, "what does the user like to drink?")
        assert content in profile and content in memories
    return user, sid, mid


def _gone_everywhere(pair: tuple[memlane.Client, memlane.Client], sid: str, text: str) -> None:
    for c in pair:
        profile, memories = _seen(c, sid, "what does the user like to drink?")
        assert text not in profile and text not in memories, (profile, memories)


def test_delete_takes_effect_on_the_next_assembly_on_both_sidecars(
    pair: tuple[memlane.Client, memlane.Client],
) -> None:
    user, sid, mid = _setup(pair, "User prefers jasmine tea.")
    pair[0].delete_memory(caller=_who(user), memory_id=mid)
    _gone_everywhere(pair, sid, "jasmine")


def test_update_takes_effect_on_the_next_assembly_on_both_sidecars(
    pair: tuple[memlane.Client, memlane.Client],
) -> None:
    user, sid, mid = _setup(pair, "User prefers oolong tea.")
    pair[1].update_memory(
        caller=_who(user),
        memory=mpb.Memory(memory_id=mid, content="User prefers black coffee."),
        update_mask=FieldMask(paths=["content"]),
    )
    _gone_everywhere(pair, sid, "oolong")
    for c in pair:
        assert "User prefers black coffee." in _seen(c, sid, "what does the user like to drink?")[0]


def test_wrong_feedback_takes_effect_on_the_next_assembly_on_both_sidecars(
    pair: tuple[memlane.Client, memlane.Client],
) -> None:
    user, sid, mid = _setup(pair, "User prefers rooibos tea.")
    pair[0].record_feedback(caller=_who(user), memory_id=mid, verdict=mpb.FEEDBACK_VERDICT_WRONG)
    _gone_everywhere(pair, sid, "rooibos")


def test_supersede_takes_effect_on_the_next_assembly_on_both_sidecars(
    pair: tuple[memlane.Client, memlane.Client],
) -> None:
    a, b = pair
    user = f"u-{uuid.uuid4().hex[:8]}"
    said = spb.Message(message_id="m1", role=spb.ROLE_USER, content="I live in Bangalore.")
    a.extract_memories(caller=_who(user), session_id="s1", messages=[said])
    sid = a.create_session(user_id=user, agent_id=AGENT).session.session_id
    for c in pair:
        assert "User lives in Bangalore." in _seen(c, sid, "where does the user live?")[0]
    moved = spb.Message(message_id="m2", role=spb.ROLE_USER, content="I moved to Pune.")
    out = b.extract_memories(caller=_who(user), session_id="s2", messages=[moved])
    assert [m.outcome for m in out.memories] == [mpb.INGEST_OUTCOME_SUPERSEDED]
    for c in pair:
        profile, memories = _seen(c, sid, "where does the user live?")
        assert "Pune" in profile and "Bangalore" not in profile and "Bangalore" not in memories


def test_erasure_takes_effect_on_the_next_assembly_on_both_sidecars(
    pair: tuple[memlane.Client, memlane.Client],
) -> None:
    a, b = pair
    user, _, _ = _setup(pair, "User prefers matcha tea.")
    b.forget_user(user_id=user)
    # The erasure took the session too: read through a new one (the caches are per user, not session).
    sid = a.create_session(user_id=user, agent_id=AGENT).session.session_id
    _gone_everywhere(pair, sid, "matcha")


def test_a_user_without_memories_gets_their_first_one_on_the_next_assembly_on_both_sidecars(
    pair: tuple[memlane.Client, memlane.Client],
) -> None:
    """Assembly skips profile and recall for a caller who can see no memory at the user's current LTM
    version (no query embedding); the first write changes the version, so it shows at once."""
    a, b = pair
    user = f"u-{uuid.uuid4().hex[:8]}"
    sid = a.create_session(user_id=user, agent_id=AGENT).session.session_id
    for c in pair:
        for _ in range(2):  # the second assembly takes the remembered answer
            assert _seen(c, sid, "what does the user like to drink?") == ("", "")
    b.create_memory(caller=_who(user), kind=mpb.MEMORY_KIND_PREFERENCE, content="User prefers mint tea.")
    for c in pair:
        profile, memories = _seen(c, sid, "what does the user like to drink?")
        assert "mint tea" in profile and "mint tea" in memories
    # Another agent's private memory is not the first one this caller sees: still nothing for it.
    other = f"u-{uuid.uuid4().hex[:8]}"
    sid2 = a.create_session(user_id=other, agent_id=AGENT).session.session_id
    assert _seen(a, sid2, "what does the user like?") == ("", "")
    a.create_memory(
        caller=mpb.Caller(user_id=other, agent_id="agent-b"),
        kind=mpb.MEMORY_KIND_PREFERENCE,
        content="User prefers green tea.",
        scope=mpb.MEMORY_SCOPE_AGENT,
    )
    assert _seen(a, sid2, "what does the user like?") == ("", "")


@pytest.fixture(scope="module")
def two(
    start_server: ServerFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SidecarThread, memlane.Client, memlane.Client]]:
    shared = {"key_prefix": f"t{uuid.uuid4().hex[:10]}", "ltm_uri": str(tmp_path_factory.mktemp("ltm"))}
    a, b = start_server(**shared), start_server(**shared)
    with memlane.Client(a.target, timeout=30) as ca, memlane.Client(b.target, timeout=30) as cb:
        yield a, ca, cb


def test_a_reader_catches_up_with_rows_added_elsewhere_and_reloads_after_a_removal(
    two: tuple[SidecarThread, memlane.Client, memlane.Client],
) -> None:
    """Learning in a worker adds rows all the time: the reader's in-memory entry takes the new rows in
    (a catch-up), instead of reading the user's every row again; a removal elsewhere cannot be seen in
    what changed, so it reloads."""
    server_a, a, b = two
    user = f"u-{uuid.uuid4().hex[:8]}"
    facts = [f"The user's locker number {i} is on floor {i % 7}." for i in range(30)]
    for fact in facts:
        b.create_memory(caller=_who(user), kind=mpb.MEMORY_KIND_FACT, content=fact)
    stats = server_a.sidecar.ltm.hot_index.stats if server_a.sidecar.ltm else None
    assert stats is not None
    assert a.search_memories(caller=_who(user), query="which locker?", limit=5).results  # loads the entry
    loads, catch_ups = stats.misses, stats.catch_ups
    added = b.create_memory(caller=_who(user), kind=mpb.MEMORY_KIND_FACT, content="Dana keeps bees.")
    hits = a.search_memories(caller=_who(user), query="who keeps bees?", limit=3).results
    assert hits[0].memory.memory_id == added.memory.memory_id  # seen at once ...
    assert (stats.misses, stats.catch_ups) == (loads, catch_ups + 1)  # ... by a catch-up, not a load
    # Removed elsewhere: the reader reloads (a positive control of the check above), and never serves it.
    b.delete_memory(caller=_who(user), memory_id=added.memory.memory_id)
    hits = a.search_memories(caller=_who(user), query="who keeps bees?", limit=3).results
    assert added.memory.memory_id not in [h.memory.memory_id for h in hits]
    assert stats.misses == loads + 1 and stats.catch_ups == catch_ups + 1
    # An edit elsewhere replaces the row in the entry: the old text is gone, the new one found.
    target = hits[0].memory.memory_id
    mask = FieldMask(paths=["content"])
    b.update_memory(
        caller=_who(user),
        memory=mpb.Memory(memory_id=target, content="The user's bike is in garage 9."),
        update_mask=mask,
    )
    hits = a.search_memories(caller=_who(user), query="where is the bike?", limit=3).results
    assert hits[0].memory.memory_id == target and "garage 9" in hits[0].memory.content
    assert sum(h.memory.memory_id == target for h in hits) == 1
    assert stats.catch_ups == catch_ups + 2
