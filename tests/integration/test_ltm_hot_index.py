"""The in-memory recall index (ltm/hot.py) serves exactly what LanceDB would: the same rows for every
reader and filter, every write visible on the next search, the access rule intact, and the same ranking
as a sidecar without it."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest
from google.protobuf.field_mask_pb2 import FieldMask

import memlane
from memlane.v1 import memory_pb2 as mpb
from memlane_server.background import SidecarThread
from memlane_server.ltm import (
    LanceMemoryStore,
    MemoryFilter,
    MemoryItem,
    MemoryKind,
    MemoryScope,
    Visibility,
    filters,
)
from memlane_server.ltm.hot import HotIndex, mask_for
from tests.conftest import ServerFactory

NDIMS = 384
NOW = 1_000_000


def _corpus(rng: random.Random) -> list[MemoryItem]:
    users, agents, groups, channels = ["u1", "u2"], ["a", "b", ""], ["", "g1", "g2"], ["", "web", "sms"]
    items = []
    for n in range(400):
        group = rng.choice(groups)
        scope = MemoryScope.GROUP if group else rng.choice(list(MemoryScope))
        items.append(
            MemoryItem(
                id=f"m{n}",
                user_id=rng.choice(users),
                agent_id=rng.choice(agents),
                scope=scope,
                group=group if scope is MemoryScope.GROUP else "",
                kind=rng.choice(list(MemoryKind)),
                content=f"item {n}",
                channel=rng.choice(channels),
                created_at_ms=NOW - n,
                occurred_at_ms=NOW - rng.randrange(0, 5000),
                valid_until_ms=rng.choice([0, 0, NOW - 1, NOW + 1]),
                superseded_by=rng.choice(["", "", "", "m0"]),
                source_session_id=rng.choice(["", "s1", "s2"]),
                vector=[rng.random() for _ in range(NDIMS)],
            )
        )
    return items


def _filters(rng: random.Random) -> list[MemoryFilter]:
    out = [MemoryFilter(), MemoryFilter(episodes_from_channel=""), MemoryFilter(episodes_from_channel="web")]
    for _ in range(40):
        out.append(
            MemoryFilter(
                kinds=rng.sample(list(MemoryKind), rng.randrange(0, 3)),
                scopes=rng.sample(list(MemoryScope), rng.randrange(0, 3)),
                channel=rng.choice(["", "", "web", "sms", "nowhere"]),
                episodes_from_channel=rng.choice([None, "", "web"]),
                episodes_not_from_session=rng.choice(["", "", "s1"]),
                since_ms=rng.choice([0, NOW - 2500]),
                until_ms=rng.choice([0, NOW - 1000]),
            )
        )
    return out


async def test_the_mask_selects_exactly_the_rows_lancedb_selects(tmp_path: Path) -> None:
    rng = random.Random(15)
    store = await LanceMemoryStore.open(str(tmp_path / "ltm"), NDIMS)
    await store.add(_corpus(rng))
    hot = HotIndex(store, max_bytes=64 << 20)
    readers = [
        Visibility(u, a, g)
        for u in ("u1", "u2", "u3")
        for a in ("a", "b", "")
        for g in ([], ["g1"], ["g1", "g2"])
    ]
    nonempty = 0
    for who in readers:
        entry = await hot.view(who)
        assert entry is not None
        ids = entry.meta["id"].to_pylist()
        for flt in _filters(rng):
            want = {i.id for i in await store.fetch(filters.recall_filter(who, flt, NOW))}
            got = {ids[i] for i, keep in enumerate(mask_for(entry, flt, NOW)) if keep}
            assert got == want, (who, flt)
            nonempty += bool(want)
    assert nonempty > 100  # positive control: the comparison is not between empty sets
    store.close()


@pytest.fixture(scope="module")
def uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("ltm"))


@pytest.fixture(scope="module")
def hot_server(start_server: ServerFactory, uri: str) -> SidecarThread:
    return start_server(ltm_uri=uri)


def _ids(
    c: memlane.Client, who: mpb.Caller, query: str, mode: mpb.SearchMode.ValueType = mpb.SEARCH_MODE_VECTOR
) -> list[str]:
    return [
        r.memory.memory_id for r in c.search_memories(caller=who, query=query, limit=20, mode=mode).results
    ]


def test_writes_show_on_the_next_search_and_the_access_rule_holds(
    hot_server: SidecarThread, user_id: str
) -> None:
    me, peer = mpb.Caller(user_id=user_id, agent_id="a"), mpb.Caller(user_id=user_id, agent_id="b")
    with memlane.Client(hot_server.target, timeout=30) as c:
        first = c.create_memory(caller=me, kind=mpb.MEMORY_KIND_FACT, content="The user keeps bees.").memory
        assert _ids(c, me, "bees") == [first.memory_id] == _ids(c, peer, "bees")  # both entries loaded
        ltm = hot_server.sidecar.ltm
        assert ltm is not None and ltm.hot_index.holds(user_id)  # positive control: served from memory
        private = c.create_memory(
            caller=me, kind=mpb.MEMORY_KIND_FACT, scope=mpb.MEMORY_SCOPE_AGENT, content="Hive code 4471."
        ).memory
        assert set(_ids(c, me, "hive code")) == {first.memory_id, private.memory_id}
        assert _ids(c, peer, "hive code") == [first.memory_id]  # another agent never sees it
        c.update_memory(
            caller=me,
            memory=mpb.Memory(memory_id=first.memory_id, content="The user keeps goats."),
            update_mask=FieldMask(paths=["content"]),
        )
        hits = c.search_memories(caller=peer, query="goats", limit=1, mode=mpb.SEARCH_MODE_VECTOR).results
        assert hits[0].memory.content == "The user keeps goats."
        c.record_feedback(caller=me, memory_id=private.memory_id, verdict=mpb.FEEDBACK_VERDICT_WRONG)
        assert _ids(c, me, "hive code") == [first.memory_id]
        c.delete_memory(caller=me, memory_id=first.memory_id)
        assert _ids(c, me, "goats") == [] == _ids(c, peer, "goats")
        # Nothing visible: answered without a model call or an index scan, and still right.
        assert _ids(c, me, "goats", mpb.SEARCH_MODE_HYBRID) == []


def test_ranking_matches_a_sidecar_without_the_index(
    hot_server: SidecarThread, start_server: ServerFactory, uri: str, user_id: str
) -> None:
    who = mpb.Caller(user_id=user_id, agent_id="a")
    places = ["Pune", "Lyon", "Oslo", "Quito", "Hanoi", "Perth", "Cusco", "Turku"]
    facts = [f"Fact {n}: the user visited {place} in {1990 + n}." for n, place in enumerate(places)]
    with memlane.Client(hot_server.target, timeout=30) as hot:
        for text in facts:
            hot.create_memory(caller=who, kind=mpb.MEMORY_KIND_FACT, content=text)
    # Started after the writes, so its view of the shared directory holds them.
    cold_server = start_server(ltm_uri=uri, ltm_hot_index_mb=0)
    with (
        memlane.Client(hot_server.target, timeout=30) as hot,
        memlane.Client(cold_server.target, timeout=30) as cold,
    ):
        for query in ("where did the user travel?", "Oslo", "a trip in 1995", f"{uuid.uuid4().hex} nothing"):
            for mode in (mpb.SEARCH_MODE_VECTOR, mpb.SEARCH_MODE_HYBRID):
                want = _ids(cold, who, query, mode)
                assert len(want) == len(facts) or mode == mpb.SEARCH_MODE_HYBRID
                assert _ids(hot, who, query, mode) == want, (query, mode)
        # The profile (read from the index when it holds the reader) too, after writes of other kinds.
        hot.create_memory(caller=who, kind=mpb.MEMORY_KIND_INSTRUCTION, content="Answer in French.")
        hot.create_memory(caller=who, kind=mpb.MEMORY_KIND_EPISODIC, content="We talked about Lyon.")
        served = hot.get_profile(caller=who)
        assert [m.content for m in served.instructions] == ["Answer in French."]
        assert len(served.facts) == len(facts) and not served.preferences
    ltm = hot_server.sidecar.ltm
    assert ltm is not None and ltm.hot_index.stats.hits > 0
