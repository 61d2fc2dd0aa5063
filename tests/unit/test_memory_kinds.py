"""The one list of memory kinds (memory_kinds.py) and what is derived from it: the kinds a model may
state, the draft ltm's NewMemory builds on."""

from __future__ import annotations

from dataclasses import fields

from memlane_server.extraction.openai_compat import RESPONSE_SCHEMA
from memlane_server.ltm.model import NewMemory
from memlane_server.memory_kinds import STATED_KINDS, MemoryDraft, MemoryKind


def test_every_kind_but_episodes_may_be_stated_and_a_model_is_offered_exactly_those() -> None:
    assert set(STATED_KINDS) == set(MemoryKind) - {MemoryKind.EPISODIC}
    offered = RESPONSE_SCHEMA["properties"]["memories"]["items"]["properties"]["kind"]["enum"]
    assert offered == [k.value for k in STATED_KINDS]


def test_a_new_memory_is_a_draft_with_the_fields_only_create_sets() -> None:
    draft = {f.name for f in fields(MemoryDraft)}
    extra = {f.name for f in fields(NewMemory)} - draft
    assert issubclass(NewMemory, MemoryDraft) and draft <= {f.name for f in fields(NewMemory)}
    assert extra == {"scope", "group", "memory_id", "valid_until_ms"}
