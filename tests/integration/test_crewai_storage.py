"""CrewAI on memlane, against CrewAI's own LanceDBStorage (its default backend, on disk in a tmp dir):
the same records, embedded once by MemlaneEmbedder (the sidecar's model), give the same search results
and scores, the same listings, scope info, categories, counts, updates and deletions; CrewAI's real
Memory recalls the same through both. Runs in its own environment (scripts/test-crewai): crewai
requires openai<3, the openai-agents extra openai>=3."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from crewai.memory import Memory
from crewai.memory.storage.lancedb_storage import LanceDBStorage
from crewai.memory.types import MemoryRecord

import memlane
from memlane.integrations.crewai import MemlaneEmbedder, MemlaneStorage
from memlane.v1 import memory_pb2 as mpb
from memlane_server.background import SidecarThread

T0 = datetime(2026, 1, 5, 9, 0, 0)
ROWS: list[tuple[str, str, list[str], dict[str, Any], float]] = [
    ("The backend team deploys on Tuesdays.", "/company/eng/backend", ["process"], {"team": "a"}, 0.7),
    ("The API gateway runs on Kubernetes.", "/company/eng", ["tech"], {"team": "a"}, 0.6),
    ("Quarterly planning happens in March.", "/company", ["process"], {"team": "b"}, 0.4),
    ("Dana prefers short status reports.", "/personal/dana", ["preference"], {}, 0.9),
    ("The database is PostgreSQL 16.", "/company/eng/backend", ["tech"], {"team": "b"}, 0.5),
    ("Offsite in Porto next spring.", "/company-events", ["event"], {"city": "Porto"}, 0.3),
]


def _records(embedder: MemlaneEmbedder) -> list[MemoryRecord]:
    vectors = embedder([r[0] for r in ROWS])
    return [
        MemoryRecord(
            id=f"r{i}",
            content=content,
            scope=scope,
            categories=cats,
            metadata=meta,
            importance=imp,
            created_at=T0 + timedelta(days=i),
            last_accessed=T0 + timedelta(days=i),
            embedding=vec,
            source="dana" if i == 3 else None,
            private=i == 3,
        )
        for i, ((content, scope, cats, meta, imp), vec) in enumerate(zip(ROWS, vectors, strict=True))
    ]


def _view(r: MemoryRecord) -> tuple[Any, ...]:
    # last_accessed is "now" on an update in both; the embedding is not returned by memlane
    return (
        r.id,
        r.content,
        r.scope,
        r.categories,
        r.metadata,
        round(r.importance, 4),
        r.created_at,
        r.source,
        r.private,
    )


def _exercise(storage: Any, embedder: MemlaneEmbedder) -> dict[str, Any]:
    records = _records(embedder)
    storage.save(records)
    q = embedder(["Which database do we use?", "how do we plan the year"])
    seen: dict[str, Any] = {}
    searches: dict[str, dict[str, Any]] = {
        "all": {},
        "scope": {"scope_prefix": "/company/eng"},
        "categories": {"categories": ["tech"]},
        "metadata": {"metadata_filter": {"team": "b"}},
        "min_score": {"min_score": 0.4},
    }
    for name, kwargs in searches.items():
        for i, vec in enumerate(q):
            hits = storage.search(vec, limit=3, **kwargs)
            seen[f"search/{name}/{i}"] = [(r.id, round(s, 3)) for r, s in hits]
    seen["get"] = _view(storage.get_record("r1"))
    seen["get_missing"] = storage.get_record("nope")
    for scope in (None, "/company", "/company/eng", "/personal"):
        seen[f"list/{scope}"] = [r.id for r in storage.list_records(scope)]
        seen[f"count/{scope}"] = storage.count(scope)
        seen[f"categories/{scope}"] = storage.list_categories(scope)
    seen["list/page"] = [r.id for r in storage.list_records(None, limit=2, offset=1)]
    for scope in ("/", "/company", "/company/eng/backend", "/nowhere"):
        seen[f"info/{scope}"] = storage.get_scope_info(scope).model_dump()
        seen[f"scopes/{scope}"] = storage.list_scopes(scope)
    changed = records[2].model_copy(
        update={"content": "Quarterly planning moved to April.", "importance": 0.8}
    )
    storage.update(changed)
    seen["updated"] = _view(storage.get_record("r2"))
    seen["delete/ids"] = storage.delete(record_ids=["r0", "nope"])
    seen["delete/categories"] = storage.delete(categories=["event"])
    seen["delete/older"] = storage.delete(metadata_filter={"team": "b"}, older_than=T0 + timedelta(days=3))
    seen["after_deletes"] = sorted(r.id for r in storage.list_records())
    storage.reset("/personal")
    seen["after_reset_scope"] = sorted(r.id for r in storage.list_records())
    storage.reset()
    seen["after_reset"] = storage.count()
    return seen


def test_storage_answers_as_crewai_s_lancedb_storage(
    server: SidecarThread, tmp_path: Path, user_id: str
) -> None:
    embedder = MemlaneEmbedder(server.target)
    reference = _exercise(LanceDBStorage(path=str(tmp_path / "lancedb")), embedder)
    storage = MemlaneStorage(server.target, user_id=user_id, agent_id="crew")
    ours = _exercise(storage, embedder)
    assert ours == reference
    assert reference["search/all/0"][0][0] == "r4"  # positive control: the database fact ranks first
    assert reference["after_deletes"] and reference["after_reset"] == 0
    storage.close()
    embedder.close()


def test_records_are_the_caller_s_memories(
    server: SidecarThread, client: memlane.Client, user_id: str
) -> None:
    embedder = MemlaneEmbedder(server.target)
    storage = MemlaneStorage(server.target, user_id=user_id, agent_id="crew")
    storage.save(_records(embedder)[:2])
    stored = client.list_memories(caller=mpb.Caller(user_id=user_id, agent_id="crew")).memories
    assert sorted(m.memory_id for m in stored) == ["crewai-r0", "crewai-r1"]
    assert {m.channel for m in stored} == {"crewai"} and {m.kind for m in stored} == {
        mpb.MEMORY_KIND_EPISODIC
    }
    # Another user's storage sees none of them, even searching with the same vector.
    other = MemlaneStorage(server.target, user_id=f"{user_id}-other", agent_id="crew")
    vec = embedder(["deploys on Tuesdays"])[0]
    assert other.search(vec) == [] and other.count() == 0
    assert [r.id for r, _ in storage.search(vec, limit=1)] == ["r0"]  # positive control
    # reset is scoped erasure: the user's other memories stay.
    client.create_memory(
        caller=mpb.Caller(user_id=user_id), kind=mpb.MEMORY_KIND_FACT, content="Dana lives in Lisbon."
    )
    storage.reset()
    left = client.list_memories(caller=mpb.Caller(user_id=user_id, agent_id="crew")).memories
    assert [m.content for m in left] == ["Dana lives in Lisbon."]
    for s in (storage, other, embedder):
        s.close()


def test_crewai_memory_recalls_the_same_through_memlane(
    server: SidecarThread, tmp_path: Path, user_id: str
) -> None:
    embedder = MemlaneEmbedder(server.target)

    def run(storage: Any) -> list[tuple[str, str]]:
        memory = Memory(storage=storage, embedder=embedder)
        for content, scope, cats, _, imp in ROWS:
            # Every field given: CrewAI skips its LLM analysis (no model is reachable offline).
            memory.remember(content, scope=scope, categories=cats, importance=imp)
        memory.drain_writes()
        out = [
            (m.record.content, m.record.scope)
            for m in memory.recall("Which database do we use?", limit=3, depth="shallow")
        ]
        out += [
            (m.record.content, m.record.scope)
            for m in memory.recall("deploy day", scope="/company/eng", limit=2, depth="shallow")
        ]
        memory.reset()
        assert memory.list_records() == []
        memory.close()
        return out

    reference = run(LanceDBStorage(path=str(tmp_path / "lancedb")))
    storage = MemlaneStorage(server.target, user_id=user_id, agent_id="crew")
    assert run(storage) == reference
    # Positive control: CrewAI weighs importance and recency too, but the database fact is recalled.
    assert "The database is PostgreSQL 16." in [content for content, _ in reference[:3]]
    storage.close()
    embedder.close()
