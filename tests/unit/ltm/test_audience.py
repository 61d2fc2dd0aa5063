"""The audience model of ingest (ltm/conflicts.py): what a draft may supersede and what it may merge into."""

from __future__ import annotations

import pytest

from memlane_server.ltm import MemoryItem, MemoryKind, MemoryScope, NewMemory
from memlane_server.ltm.conflicts import (
    Action,
    Audience,
    Decision,
    may_merge,
    may_retire_across,
    may_supersede,
    newest_wins,
)

AGENT, USER, SHARED, GROUP = MemoryScope.AGENT, MemoryScope.USER, MemoryScope.SHARED, MemoryScope.GROUP


def item(scope: MemoryScope, group: str = "") -> MemoryItem:
    return MemoryItem(
        id="m", user_id="u", agent_id="a", scope=scope, group=group, kind=MemoryKind.FACT, content="x"
    )


def draft(scope: MemoryScope | None, group: str = "", kind: MemoryKind = MemoryKind.FACT) -> NewMemory:
    return NewMemory(kind=kind, content="x", scope=scope.value if scope else "", group=group)


ITEMS = [item(AGENT), item(USER), item(SHARED), item(GROUP, "g"), item(GROUP, "h")]


@pytest.mark.parametrize(
    ("d", "allowed"),
    [
        # No explicit scope, or a user-wide one: it came from the user's conversation; it may change anything.
        (draft(None), [True, True, True, True, True]),
        (draft(USER), [True, True, True, True, True]),
        (draft(SHARED), [True, True, True, True, True]),
        # From a group turn: the agent's private items and that group's, never wider or another group.
        (draft(GROUP, "g"), [True, False, False, True, False]),
        # From an agent-private turn: only the agent's private items.
        (draft(AGENT), [True, False, False, False, False]),
    ],
)
def test_a_draft_supersedes_only_items_whose_readers_could_read_its_source(
    d: NewMemory, allowed: list[bool]
) -> None:
    assert [may_supersede(d, i) for i in ITEMS] == allowed


@pytest.mark.parametrize(
    ("d", "kind", "allowed"),
    [
        (draft(None), MemoryKind.FACT, [False, True, True, False, False]),  # a fact defaults to user scope
        (draft(None), MemoryKind.INSTRUCTION, [True, False, False, False, False]),  # an instruction to agent
        (draft(SHARED), MemoryKind.FACT, [False, True, True, False, False]),  # shared reaches what user does
        (draft(GROUP, "g"), MemoryKind.FACT, [False, False, False, True, False]),
        (draft(AGENT), MemoryKind.FACT, [True, False, False, False, False]),
    ],
)
def test_a_draft_merges_only_into_an_item_for_the_same_readers(
    d: NewMemory, kind: MemoryKind, allowed: list[bool]
) -> None:
    assert [may_merge(d, kind, i) for i in ITEMS] == allowed


def test_audiences_nest() -> None:
    agent, user, g = Audience.of(AGENT), Audience.of(SHARED), Audience.of(GROUP, "g")
    assert user == Audience.of(USER) and Audience.of(USER, "ignored") == user
    assert agent.within(g) and g.within(user) and agent.within(user)
    assert not user.within(g) and not g.within(agent) and not g.within(Audience.of(GROUP, "h"))


@pytest.mark.parametrize(
    ("d", "kind", "allowed"),
    [
        # Across agents only user-wide with user-wide: the old value's readers all read the new one.
        (draft(None), MemoryKind.FACT, [False, True, True, False, False]),
        (draft(SHARED), MemoryKind.FACT, [False, True, True, False, False]),
        # From the user's conversation but kept to the agent (an instruction's default): never.
        (draft(None), MemoryKind.INSTRUCTION, [False, False, False, False, False]),
        (draft(GROUP, "g"), MemoryKind.FACT, [False, False, False, False, False]),
        (draft(AGENT), MemoryKind.FACT, [False, False, False, False, False]),
    ],
)
def test_a_draft_retires_another_agents_item_only_user_wide_with_user_wide(
    d: NewMemory, kind: MemoryKind, allowed: list[bool]
) -> None:
    assert [may_retire_across(d, kind, i) for i in ITEMS] == allowed


def _said(memory_id: str, at_ms: int) -> MemoryItem:
    return MemoryItem(
        id=memory_id, user_id="u", agent_id="b", scope=USER, kind=MemoryKind.FACT, content=memory_id,
        occurred_at_ms=at_ms,
    )  # fmt: skip


def test_across_agents_the_newest_said_wins() -> None:
    old, own, newer, newest = _said("old", 100), _said("own", 900), _said("newer", 300), _said("newest", 400)
    decision = Decision(Action.SUPERSEDE, retire=[old, own, newer, newest])
    # Said at 200: another agent's items said later stay and the newest of them retires the draft; its
    # own items (not in ``others``) and the older one are retired as before.
    out = newest_wins(decision, 200, {"old", "newer", "newest"})
    assert [i.id for i in out.retire] == ["old", "own"] and out.retired_by is newest
    # Said last (ties go to the draft): everything retired, nothing retires it.
    out = newest_wins(decision, 400, {"old", "newer", "newest"})
    assert len(out.retire) == 4 and out.retired_by is None
    assert newest_wins(Decision(Action.INSERT), 0, {"old"}) == Decision(Action.INSERT)
