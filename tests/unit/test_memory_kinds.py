"""The one list of memory kinds (memory_kinds.py) and what is derived from it: the kinds a model may
state, the draft ltm's NewMemory builds on, the scope an item of each kind gets when none is named."""

from __future__ import annotations

from dataclasses import fields

from memlane_server.extraction.openai_compat import RESPONSE_SCHEMA
from memlane_server.ltm.model import NewMemory
from memlane_server.memory_kinds import STATED_KINDS, MemoryDraft, MemoryKind, MemoryScope, default_scope


def test_every_kind_but_episodes_may_be_stated_and_a_model_is_offered_exactly_those() -> None:
    assert set(STATED_KINDS) == set(MemoryKind) - {MemoryKind.EPISODIC}
    offered = RESPONSE_SCHEMA["properties"]["memories"]["items"]["properties"]["kind"]["enum"]
    assert offered == [k.value for k in STATED_KINDS]


def test_a_new_memory_is_a_draft_with_the_fields_only_create_sets() -> None:
    draft = {f.name for f in fields(MemoryDraft)}
    extra = {f.name for f in fields(NewMemory)} - draft
    assert issubclass(NewMemory, MemoryDraft) and draft <= {f.name for f in fields(NewMemory)}
    assert extra == {"scope", "group", "memory_id", "valid_until_ms"}


def test_what_describes_the_user_is_every_agents_and_what_one_agent_was_given_stays_with_it() -> None:
    # The kinds named here, not every kind: a new kind declares its own (memory_kinds.DEFAULT_SCOPE,
    # checked at import) without touching this test.
    kinds = (MemoryKind.FACT, MemoryKind.PREFERENCE, MemoryKind.EPISODIC, MemoryKind.INSTRUCTION)
    assert [default_scope(k) for k in kinds] == [MemoryScope.USER] * 2 + [MemoryScope.AGENT] * 2
