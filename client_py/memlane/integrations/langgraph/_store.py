"""``MemlaneStore``: LangGraph's ``BaseStore`` over memlane's long-term memory (MemoryService).

Namespaces map onto memlane's scopes, always within one user:

- ``("user", <user_id>, ...)``: user-wide items of that user (every agent serving the user sees them);
- ``("agent", <user_id>, <agent_id>, ...)``: private to that agent;
- ``("group", <user_id>, <group>, ...)``: visible to the group's agents;
- anything else: user-wide items of the store's ``user_id``.

Each item is one memory (kind EPISODIC, so it never merges with another: a key is a key) whose id is
derived from (user, namespace, key). The JSON value is kept whole in the memory's metadata; the text
memlane embeds and indexes is the value's fields named by ``index`` (default: the whole value as JSON).
``search`` with a query is memlane's hybrid recall (BM25 + vectors + recency + usage + importance);
without one, items are listed oldest first. TTLs are memlane's ``valid_until``: an expired item is
never served again. Filters (equality, ``$gt``/``$lt``/``$ne``...) apply to the value, as in
LangGraph's own stores. Values are screened like every memory: one holding personal data (an email,
a card number) is refused.

``batch`` uses a blocking ``memlane.Client``; ``abatch`` runs it in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from google.protobuf.field_mask_pb2 import FieldMask
from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
)
from langgraph.store.base.embed import get_text_at_path, tokenize_path
from langgraph.store.memory import _compare_values, _does_match

from memlane import Client, NotFoundError
from memlane.v1 import memory_pb2 as mpb

CHANNEL = "langgraph.store"
NS_KEY, KEY_KEY, VALUE_KEY, TTL_KEY = "lg.ns", "lg.key", "lg.value", "lg.ttl"
_PAGE = 500
_RECALL_LIMIT = 100


@dataclass(frozen=True, slots=True)
class _Place:
    caller: mpb.Caller
    scope: mpb.MemoryScope.ValueType
    group: str = ""


class MemlaneStore(BaseStore):
    supports_ttl = True

    def __init__(
        self,
        target: str | Client = "127.0.0.1:50051",
        *,
        user_id: str = "",
        agent_id: str = "",
        token: str | None = None,
        ttl: TTLConfig | None = None,
    ) -> None:
        self._owned = isinstance(target, str)
        self.client = (
            Client(target, token=token, agent_id=agent_id or None) if isinstance(target, str) else target
        )
        self.user_id = user_id
        self.agent_id = agent_id
        self.ttl_config = ttl

    def close(self) -> None:
        if self._owned:
            self.client.close()

    # ------------------------------------------------------------------------------------ placement

    def _place(self, ns: tuple[str, ...]) -> _Place:
        head = ns[0] if ns else ""
        if head == "user" and len(ns) >= 2:
            return _Place(mpb.Caller(user_id=ns[1]), mpb.MEMORY_SCOPE_USER)
        if head == "agent" and len(ns) >= 3:
            return _Place(mpb.Caller(user_id=ns[1], agent_id=ns[2]), mpb.MEMORY_SCOPE_AGENT)
        if head == "group" and len(ns) >= 3:
            caller = mpb.Caller(user_id=ns[1], agent_id=self.agent_id, groups=[ns[2]])
            return _Place(caller, mpb.MEMORY_SCOPE_GROUP, ns[2])
        if not self.user_id:
            raise ValueError(
                f"namespace {ns!r} names no user: start it with ('user', <user_id>) "
                "or give MemlaneStore a user_id"
            )
        return _Place(mpb.Caller(user_id=self.user_id), mpb.MEMORY_SCOPE_USER)

    def _id(self, place: _Place, ns: tuple[str, ...], key: str) -> str:
        raw = json.dumps([place.caller.user_id, list(ns), key]).encode()
        return "lgs-" + hashlib.blake2b(raw, digest_size=20).hexdigest()

    # ------------------------------------------------------------------------------------ batch

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        out: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                out.append(self._get(op))
            elif isinstance(op, SearchOp):
                out.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                out.append(self._list_namespaces(op))
            elif isinstance(op, PutOp):
                self._put(op)
                out.append(None)
            else:
                raise ValueError(f"unknown operation {type(op).__name__}")
        return out

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    def _get(self, op: GetOp) -> Item | None:
        place = self._place(op.namespace)
        try:
            m = self.client.get_memory(
                caller=place.caller, memory_id=self._id(place, op.namespace, op.key)
            ).memory
        except NotFoundError:
            return None
        if not _live(m):  # GetMemory also shows retired items (a viewer's history); a store does not
            return None
        if self._refresh(op.refresh_ttl):
            self._touch(place, m)
        return _item(m)

    def _put(self, op: PutOp) -> None:
        place = self._place(op.namespace)
        mid = self._id(place, op.namespace, op.key)
        if op.value is None:
            with contextlib.suppress(NotFoundError):  # deleting a missing key is a no-op, as in LangGraph
                self.client.delete_memory(caller=place.caller, memory_id=mid)
            return
        ttl = op.ttl if isinstance(op.ttl, int | float) else (self.ttl_config or {}).get("default_ttl")
        metadata = {
            NS_KEY: json.dumps(list(op.namespace)),
            KEY_KEY: op.key,
            VALUE_KEY: json.dumps(op.value, default=str),
            TTL_KEY: str(ttl) if ttl else "",
        }
        until = _until(ttl)
        content = _text(op)
        try:
            self.client.get_memory(caller=place.caller, memory_id=mid)
        except NotFoundError:
            self.client.create_memory(
                caller=place.caller,
                memory_id=mid,
                kind=mpb.MEMORY_KIND_EPISODIC,
                scope=place.scope,
                group=place.group,
                content=content,
                channel=CHANNEL,
                valid_until_unix_ms=until,
                metadata=metadata,
            )
            return
        self.client.update_memory(
            caller=place.caller,
            memory=mpb.Memory(memory_id=mid, content=content, metadata=metadata, valid_until_unix_ms=until),
            update_mask=FieldMask(paths=["content", "metadata", "valid_until_unix_ms"]),
        )

    def _refresh(self, asked: bool | None) -> bool:
        if asked is not None:
            return asked
        return bool((self.ttl_config or {}).get("refresh_on_read", True))

    def _touch(self, place: _Place, m: mpb.Memory) -> None:
        ttl = m.metadata.get(TTL_KEY)
        if ttl:
            self.client.update_memory(
                caller=place.caller,
                memory=mpb.Memory(memory_id=m.memory_id, valid_until_unix_ms=_until(float(ttl))),
                update_mask=FieldMask(paths=["valid_until_unix_ms"]),
            )

    def _all(self, place: _Place) -> list[mpb.Memory]:
        """Every live store item of the place's user (and agent / group), oldest first."""
        out: list[mpb.Memory] = []
        token = ""
        while True:
            page = self.client.list_memories(
                caller=place.caller,
                filter=mpb.MemoryFilter(channel=CHANNEL),
                page_size=_PAGE,
                page_token=token,
            )
            out += page.memories
            token = page.next_page_token
            if not token:
                break
        out.sort(key=lambda m: (m.created_at_unix_ms, m.memory_id))
        return out

    def _scan_place(self, prefix: tuple[str, ...]) -> _Place:
        """Whose items a search or listing under ``prefix`` reads: one agent's or group's when the prefix
        names it, else every item of the prefix's user (or the store's user)."""
        if len(prefix) >= 3 and prefix[0] in ("agent", "group") and "*" not in prefix[:3]:
            return self._place(prefix)
        if len(prefix) >= 2 and prefix[0] in ("user", "agent", "group") and prefix[1] != "*":
            return _Place(mpb.Caller(user_id=prefix[1]), mpb.MEMORY_SCOPE_USER)
        return self._place(())

    def _search(self, op: SearchOp) -> list[SearchItem]:
        place = self._scan_place(op.namespace_prefix)
        prefix = op.namespace_prefix
        scored: list[tuple[mpb.Memory, float | None]]
        if op.query:
            hits = self.client.search_memories(
                caller=place.caller,
                query=op.query,
                limit=_RECALL_LIMIT,
                filter=mpb.MemoryFilter(channel=CHANNEL),
                mode=mpb.SEARCH_MODE_HYBRID,
            ).results
            scored = [(h.memory, float(h.score)) for h in hits]
        else:
            scored = [(m, None) for m in self._all(place)]
        keep: list[tuple[SearchItem, mpb.Memory]] = []
        for m, score in scored:
            item = _item(m)
            if item.namespace[: len(prefix)] != prefix:
                continue
            if op.filter and not all(_compare_values(item.value.get(k), v) for k, v in op.filter.items()):
                continue
            found = SearchItem(
                item.namespace, item.key, item.value, item.created_at, item.updated_at, score=score
            )
            keep.append((found, m))
        page = keep[op.offset : op.offset + op.limit]
        if self._refresh(op.refresh_ttl):
            for found, m in page:
                self._touch(self._place(found.namespace), m)
        return [found for found, _ in page]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        prefix = next((tuple(c.path) for c in op.match_conditions or () if c.match_type == "prefix"), ())
        found = {_item(m).namespace for m in self._all(self._scan_place(prefix))}
        if op.match_conditions:
            found = {ns for ns in found if all(_does_match(c, ns) for c in op.match_conditions)}
        if op.max_depth is not None:
            found = {ns[: op.max_depth] for ns in found}
        return sorted(found)[op.offset : op.offset + op.limit]


def _live(m: mpb.Memory) -> bool:
    return not m.superseded_by and not (0 < m.valid_until_unix_ms <= time.time() * 1000)


def _until(ttl_minutes: float | None) -> int:
    return int(time.time() * 1000 + ttl_minutes * 60_000) if ttl_minutes else 0


def _text(op: PutOp) -> str:
    value = op.value or {}
    if isinstance(op.index, list):
        texts = [t for path in op.index for t in get_text_at_path(value, tokenize_path(path))]
        if texts:
            return "\n".join(texts)
    return json.dumps(value, ensure_ascii=False, default=str)


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _item(m: mpb.Memory) -> Item:
    return Item(
        value=json.loads(m.metadata[VALUE_KEY]),
        key=m.metadata[KEY_KEY],
        namespace=tuple(json.loads(m.metadata[NS_KEY])),
        created_at=_ts(m.created_at_unix_ms),
        updated_at=_ts(m.updated_at_unix_ms or m.created_at_unix_ms),
    )
