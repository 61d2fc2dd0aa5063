"""Long-term memory at the domain level: real ONNX model, real LanceDB in a tmp dir, no mocks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from memlane_server.config import Settings
from memlane_server.embedding import OnnxEmbedder
from memlane_server.errors import AlreadyExists, InvalidArgument, NotFound
from memlane_server.extraction import RulesExtractor, build_episodes
from memlane_server.ltm import (
    Feedback,
    IngestOutcome,
    MemoryFilter,
    MemoryKind,
    MemoryPatch,
    MemoryScope,
    MemoryService,
    NewMemory,
    Owner,
    RecallQuery,
    SearchMode,
    Visibility,
)
from memlane_server.ltm.tuning import DAY_MS
from memlane_server.sessions.model import Message, Role, Session
from memlane_server.wiring.stores import memory_tuning
from tests.ltm_fixtures import embedder, memory, open_memory

__all__ = ["embedder", "memory"]

U = Owner("u1", "agent-a", "web", "s1")
WHO = Visibility("u1", "agent-a")


async def test_embedder_is_normalized_batched_and_cached(embedder: OnnxEmbedder) -> None:
    texts = [f"sentence number {i} about hiking" for i in range(40)]
    many = await embedder.embed(texts)
    assert many.shape == (40, 384)
    assert abs(float((many**2).sum(axis=1).mean()) - 1.0) < 1e-4
    one = await embedder.embed([texts[7]])
    assert float(one[0] @ many[7]) > 0.9999  # batching and padding do not change a vector
    hits = embedder.cache.hits
    await embedder.embed([texts[7]])
    assert embedder.cache.hits == hits + 1
    together = await asyncio.gather(*[embedder.embed([t]) for t in texts[:8]])
    assert all(float(v[0] @ many[i]) > 0.9999 for i, v in enumerate(together))


async def test_recall_is_hybrid_with_parts(memory: MemoryService) -> None:
    await memory.ingest(
        U,
        [
            NewMemory("fact", "User's laptop is a ThinkPad X1 Carbon.", keywords=["ThinkPad"]),
            NewMemory("preference", "User likes trail running on weekends."),
            NewMemory("fact", "User's order SKU-4411-B was delayed."),
        ],
    )
    hits = await memory.search(RecallQuery(WHO, "SKU-4411-B", 3))
    assert hits[0].item.content == "User's order SKU-4411-B was delayed."
    assert hits[0].parts.keyword_rank == 1 and hits[0].parts.final == hits[0].score
    hits = await memory.search(RecallQuery(WHO, "what sport does the user do", 1))
    assert "running" in hits[0].item.content and hits[0].parts.vector_rank == 1
    kw = await memory.search(RecallQuery(WHO, "ThinkPad", 3, mode=SearchMode.KEYWORD))
    assert [h.parts.vector_rank for h in kw] == [0] and kw[0].parts.keyword_rank == 1


async def test_bangalore_then_pune_supersedes(memory: MemoryService) -> None:
    extractor = RulesExtractor()
    s1 = [Message("m1", "s1", Role.USER, "I live in Bangalore and I prefer metric units.")]
    first = await memory.ingest(U, extractor.extract_sync(s1).memories)
    s2 = [Message("m9", "s2", Role.USER, "I moved to Pune. From now on, use imperial units.")]
    second = await memory.ingest(Owner("u1", "agent-a", "web", "s2"), extractor.extract_sync(s2).memories)
    assert {r.outcome for r in second} == {IngestOutcome.SUPERSEDED}
    assert sorted(i for r in second for i in r.superseded_ids) == sorted(r.item.id for r in first)
    hits = await memory.search(RecallQuery(WHO, "where does the user live, Bangalore?", 10))
    contents = [h.item.content for h in hits]
    assert "User lives in Pune." in contents and "User lives in Bangalore." not in contents
    profile = await memory.profile(WHO)
    texts = [i.content for i in profile.items()]
    assert "From now on: use imperial units." in texts and "User prefers metric units." not in texts
    audit = await memory.list_items(Visibility("u1"), MemoryFilter(include_retired=True))
    old = next(i for i in audit.items if i.content == "User lives in Bangalore.")
    assert old.superseded_by and old.valid_until_ms > 0 and old.source_message_ids == ["m1"]


async def test_duplicate_merges(memory: MemoryService) -> None:
    a = await memory.create(U, NewMemory("preference", "User likes dark roast coffee.", importance=0.9))
    await memory.bump_usage([a.item.id])
    await memory.flush_usage()
    b = await memory.create(U, NewMemory("preference", "The user likes dark roast coffee", importance=0.4))
    assert b.outcome is IngestOutcome.MERGED and b.item.id == a.item.id
    got = await memory.get(WHO, a.item.id)
    assert got.content == "The user likes dark roast coffee" and got.importance == pytest.approx(0.9)
    assert got.usage_count == 1
    assert (await memory.list_items(WHO, MemoryFilter())).total == 1


async def test_users_and_scopes_never_mix(memory: MemoryService) -> None:
    await memory.create(Owner("alice", "a1"), NewMemory("fact", "User's dog is named Bruno."))
    await memory.create(Owner("o'brien') OR (1=1", "a1"), NewMemory("fact", "User's dog is named Rex."))
    await memory.create(
        Owner("alice", "a1"), NewMemory("instruction", "Never mention the dog.", scope="agent")
    )
    await memory.create(
        Owner("alice", "a1"), NewMemory("fact", "Team dog is Max.", scope="group", group="g1")
    )
    # Positive control: the same query finds the owner's items, its agent's private one included.
    alice_own_agent = await memory.search(RecallQuery(Visibility("alice", "a1"), "dog", 10))
    assert {h.item.content for h in alice_own_agent} == {
        "User's dog is named Bruno.",
        "Never mention the dog.",
    }
    for who in (Visibility("bob", "a1"), Visibility("o'brien", "a1"), Visibility("alice' OR '1'='1", "a1")):
        assert await memory.search(RecallQuery(who, "dog", 10)) == []
    alice_other_agent = await memory.search(RecallQuery(Visibility("alice", "a2"), "dog", 10))
    assert [h.item.content for h in alice_other_agent] == ["User's dog is named Bruno."]
    alice_group = await memory.search(RecallQuery(Visibility("alice", "a2", ["g1"]), "dog", 10))
    assert {h.item.content for h in alice_group} == {"User's dog is named Bruno.", "Team dog is Max."}
    injected = await memory.search(RecallQuery(Visibility("o'brien') OR (1=1", "a1"), "dog", 10))
    assert [h.item.content for h in injected] == ["User's dog is named Rex."]


async def test_filters_kind_channel_time(memory: MemoryService) -> None:
    await memory.ingest(
        Owner("u1", "agent-a", "voice"), [NewMemory("fact", "User owns a red bicycle.", occurred_at_ms=1000)]
    )
    await memory.ingest(
        Owner("u1", "agent-a", "web"), [NewMemory("preference", "User likes red wine.", occurred_at_ms=5000)]
    )
    q = "red"
    assert {
        h.item.channel for h in await memory.search(RecallQuery(WHO, q, 10, MemoryFilter(channel="voice")))
    } == {"voice"}
    kinds = await memory.search(RecallQuery(WHO, q, 10, MemoryFilter(kinds=[MemoryKind.PREFERENCE])))
    assert [h.item.kind for h in kinds] == [MemoryKind.PREFERENCE]
    early = await memory.search(RecallQuery(WHO, q, 10, MemoryFilter(until_ms=2000)))
    assert [h.item.content for h in early] == ["User owns a red bicycle."]


async def test_crud_pagination_feedback(memory: MemoryService) -> None:
    ids = [
        (await memory.create(U, NewMemory("fact", f"User visited city number {i} called Town{i}."))).item.id
        for i in range(5)
    ]
    seen: list[str] = []
    token = ""
    while True:
        page = await memory.list_items(WHO, MemoryFilter(), page_size=2, page_token=token)
        seen += [i.id for i in page.items]
        token = page.next_page_token
        if not token:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == 5
    with pytest.raises(InvalidArgument):
        await memory.list_items(WHO, MemoryFilter(), page_token="garbage!")
    item = await memory.feedback(WHO, ids[0], Feedback.USEFUL)
    assert item.useful_count == 1 and item.importance == pytest.approx(0.6)
    before = await memory.search(RecallQuery(WHO, "Town1", 10))
    assert ids[1] in [h.item.id for h in before]  # positive control: the same query finds it
    await memory.feedback(WHO, ids[1], Feedback.WRONG)
    hits = await memory.search(RecallQuery(WHO, "Town1", 10))
    assert ids[1] not in [h.item.id for h in hits]
    from_list = (await memory.list_items(WHO, MemoryFilter(include_retired=True))).items
    assert any(i.id == ids[1] and i.wrong_count == 1 for i in from_list)
    updated = await memory.update(WHO, ids[2], MemoryPatch(content="User visited Reykjavik.", importance=0.9))
    assert updated.content == "User visited Reykjavik."
    assert (await memory.search(RecallQuery(WHO, "Iceland capital trip Reykjavik", 1)))[0].item.id == ids[2]
    await memory.delete(WHO, ids[3])
    with pytest.raises(NotFound):
        await memory.get(WHO, ids[3])
    with pytest.raises(NotFound):
        await memory.get(Visibility("someone-else"), ids[0])


async def test_client_id_is_idempotent_and_pii_rejected(memory: MemoryService) -> None:
    a = await memory.create(U, NewMemory("fact", "User plays the cello.", memory_id="cello-1"))
    again = await memory.create(U, NewMemory("fact", "User plays the cello.", memory_id="cello-1"))
    assert a.item.id == again.item.id == "cello-1"
    with pytest.raises(AlreadyExists):
        await memory.create(U, NewMemory("fact", "User plays the violin.", memory_id="cello-1"))
    with pytest.raises(InvalidArgument, match="EMAIL"):
        await memory.create(U, NewMemory("fact", "User's email is x@y.com"))
    kept = await memory.ingest(U, [NewMemory("fact", "User plays the viola.")])
    assert [r.item.content for r in kept] == ["User plays the viola."]  # positive control: ingest stores
    skipped = await memory.ingest(U, [NewMemory("fact", "User's card is 4111 1111 1111 1111")])
    assert skipped == []
    stored = (await memory.list_items(WHO, MemoryFilter(include_retired=True))).items
    assert not any("4111" in i.content for i in stored) and any("viola" in i.content for i in stored)


async def test_cap_prunes_lowest_score(tmp_path: Path, embedder: OnnxEmbedder) -> None:
    svc = await open_memory(
        tmp_path / "cap", embedder, memory_tuning(Settings.of(ltm_max_items_per_agent=5).ltm)
    )
    try:
        topics = ["chess", "sailing", "pottery", "jazz", "origami", "kayaking", "astronomy"]
        drafts = [
            NewMemory("preference", f"User enjoys {t}.", importance=0.9 if t == "chess" else 0.2)
            for t in topics
        ]
        await svc.ingest(U, drafts)
        items = (await svc.list_items(WHO, MemoryFilter())).items
        assert len(items) == 5
        assert "User enjoys chess." in [i.content for i in items]
        # Episodes have their own cap and do not push facts out.
        eps = build_episodes(
            [Message(f"e{i}", "s1", Role.USER, f"we talked about topic {i}") for i in range(3)],
            Session("s1", "u1"),
        )
        await svc.ingest(U, eps)
        assert (await svc.list_items(WHO, MemoryFilter(kinds=[MemoryKind.PREFERENCE]))).total == 5
        again = await svc.ingest(U, eps)
        assert {r.outcome for r in again} == {IngestOutcome.SKIPPED}
    finally:
        await svc.close()
        svc.store.close()


async def test_prune_job_old_unused_and_retired(tmp_path: Path, embedder: OnnxEmbedder) -> None:
    now = [1_800_000_000_000]
    svc = await open_memory(tmp_path / "prune", embedder, clock=lambda: now[0])
    try:
        stale = await svc.create(U, NewMemory("fact", "User once tried bouldering.", importance=0.3))
        kept = await svc.create(U, NewMemory("fact", "User's name is Priya.", slot="name", importance=0.9))
        used = await svc.create(U, NewMemory("fact", "User tried archery.", importance=0.3))
        await svc.bump_usage([used.item.id])
        await svc.flush_usage()
        old_city = await svc.create(U, NewMemory("fact", "User lives in Delhi.", slot="location"))
        await svc.create(U, NewMemory("fact", "User lives in Mumbai.", slot="location"))
        now[0] += int(400 * DAY_MS)
        report = await svc.prune()
        assert report.unused >= 1 and report.retired == 1
        left = {
            i.id for i in (await svc.list_items(Visibility("u1"), MemoryFilter(include_retired=True))).items
        }
        assert stale.item.id not in left and old_city.item.id not in left
        assert kept.item.id in left and used.item.id in left
    finally:
        await svc.close()
        svc.store.close()


async def test_scope_default_and_group_needs_group(memory: MemoryService) -> None:
    r = await memory.create(U, NewMemory("instruction", "Always reply in French."))
    assert r.item.scope is MemoryScope.AGENT
    with pytest.raises(InvalidArgument):
        await memory.create(U, NewMemory("fact", "Shared note.", scope="group"))
