"""MemlaneStore against LangGraph's InMemoryStore: one scenario, the same observable results.

Where they differ by design: a query is ranked by memlane's hybrid recall, while an InMemoryStore
without an embedding index returns matches unranked, so for queries only the set of items is compared
(and memlane's ranking is checked on its own). TTL is memlane-only (InMemoryStore has none). After the
last item of a namespace is deleted, InMemoryStore still lists the empty namespace; memlane does not
(as LangGraph's Postgres store, which lists namespaces from its rows).
"""

from __future__ import annotations

import uuid
from typing import Any

from langgraph.store.base import BaseStore, Item
from langgraph.store.memory import InMemoryStore

from memlane.integrations.langgraph import MemlaneStore
from memlane_server.background import SidecarThread
from tests.conftest import wait_for


def _value(item: Item | None) -> dict[str, Any]:
    """The stored value of an item the test just put (so present)."""
    assert item is not None
    return item.value


def _scenario(store: BaseStore, user: str) -> list[Any]:
    prefs, notes, agent = (
        ("user", user, "prefs"),
        ("user", user, "notes"),
        ("agent", user, "bot-a", "scratch"),
    )
    seen: list[Any] = []

    def obs(items: list[Any]) -> list[tuple[tuple[str, ...], str, Any]]:
        return [(i.namespace, i.key, i.value) for i in items]

    store.put(prefs, "lang", {"language": "Portuguese", "level": 3, "nested": {"a": [1, 2, {"b": None}]}})
    store.put(prefs, "units", {"units": "metric", "level": 5})
    store.put(notes, "trip", {"text": "Trip to Porto in May", "tags": ["travel"]})
    store.put(agent, "draft", {"step": 1})
    seen.append(_value(store.get(prefs, "lang")))
    store.put(prefs, "lang", {"language": "Spanish", "level": 4})
    seen.append(_value(store.get(prefs, "lang")))
    seen.append(store.get(prefs, "missing"))
    seen.append(_value(store.get(agent, "draft")))
    seen.append(obs(store.search(prefs)))
    seen.append(obs(store.search(prefs, filter={"level": {"$gt": 3}})))
    seen.append(obs(store.search(prefs, filter={"units": "metric"})))
    seen.append(obs(store.search(("user", user), limit=2, offset=1)))
    seen.append(sorted(obs(store.search(("user", user), query="Spanish language"))))
    seen.append(store.list_namespaces(prefix=("user", user)))
    seen.append(store.list_namespaces(prefix=("user", user), max_depth=2))
    store.delete(notes, "trip")
    seen.append(store.get(notes, "trip"))
    return seen


def test_memlane_store_matches_in_memory_store(server: SidecarThread, user_id: str) -> None:
    expected = _scenario(InMemoryStore(), user_id)
    store = MemlaneStore(server.target)
    try:
        got = _scenario(store, user_id)
        assert got == expected
        # memlane ranks: the item that says "Spanish" comes first.
        top = store.search(("user", user_id, "prefs"), query="Spanish language")
        assert top[0].key == "lang" and top[0].score is not None
        # A namespace whose last item was deleted is gone (InMemoryStore keeps listing it, empty).
        assert store.list_namespaces(prefix=("user", user_id)) == [("user", user_id, "prefs")]
    finally:
        store.close()


async def test_async_batch_and_ttl(server: SidecarThread) -> None:
    user = f"ttl-{uuid.uuid4().hex[:6]}"
    store = MemlaneStore(server.target, user_id=user)
    try:
        await store.aput(("memories",), "short", {"text": "expires soon"}, ttl=0.02)  # 1.2 s
        await store.aput(("memories",), "long", {"text": "stays"})
        assert (await store.aget(("memories",), "short")) is not None  # positive control
        wait_for(lambda: store.get(("memories",), "short", refresh_ttl=False) is None, timeout=30)
        assert _value(await store.aget(("memories",), "long")) == {"text": "stays"}
        assert [i.key for i in await store.asearch(("memories",))] == ["long"]
    finally:
        store.close()
