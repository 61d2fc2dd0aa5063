"""``MemoryService``: the domain face of long-term memory (see the package docstring for the API), with
ListMemories' keyset pages (its section below).

Recall and CRUD here; writes in ``ingest``, upkeep, export and erasure in ``upkeep``, shared state in
``core``.

ListMemories' pages: newest first by (created_at_ms, id digest), keyset-paginated inside LanceDB.

A page reads ``size + 1`` keys in that order past the cursor (LanceDB keeps the top ones while it scans
the user's rows, reading three short columns), then fetches those items whole: its cost is its own
rows, whatever the user holds. Items added while a client pages are newer than its cursor and never
shift or repeat a later page; deleted ones simply no longer appear.

The page token (``memlane_server.paging``) is bound to the reader (user, agent, groups) and to every
filter field; its cursor, (created ms, memory id), is checked by type and range and reaches LanceDB
only through ``filters.after_cursor`` (an integer and the id's digest, never the id's text).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt
from lancedb.expr import Expr

from ..errors import InvalidArgument, NotFound
from ..memory_kinds import MemoryKind, MemoryScope
from ..paging import cursor_of, decode_token, encode_token, fitting, page_size, query_fingerprint
from . import filters
from .core import canonical_slot, stated_slot
from .history import Change, ChangeReason
from .hot import HotEntry, mask_for
from .ingest import MemoryWriter, clamp, clean_keywords, embedding_text, subject_of
from .model import (
    Feedback,
    MemoryFilter,
    MemoryItem,
    MemoryPage,
    MemoryPatch,
    Profile,
    RecallQuery,
    ScoredMemory,
    SearchMode,
    Visibility,
)
from .recall import SubQuery, focus, fuse_and_rank, query_vector, speaker_hits, sub_query, text_key
from .recall import embed as embed_texts
from .store import Hit, LanceMemoryStore
from .upkeep import MemoryUpkeep

MAX_QUERY_CHARS = 2000
MAX_LIMIT = 100


class MemoryService(MemoryWriter, MemoryUpkeep):
    # ----------------------------------------------------------------------------------- recall

    async def search(self, query: RecallQuery) -> list[ScoredMemory]:
        """Hybrid recall over the memories ``query.who`` may see; best first, each with its score parts."""
        text = query.text.strip()
        given = query_vector(query.vector, self._embedder.ndims)
        if not text and (given is None or query.mode is SearchMode.KEYWORD):
            raise InvalidArgument("query is required")
        if len(text) > MAX_QUERY_CHARS:
            raise InvalidArgument(f"query is longer than {MAX_QUERY_CHARS} characters")
        if not 1 <= query.limit <= MAX_LIMIT:
            raise InvalidArgument(f"limit must be between 1 and {MAX_LIMIT}")
        self._store.check_intact()  # the in-memory index must not answer for a damaged table
        await self.freshness.current(query.who.user_id)
        now = self._clock()
        where = filters.recall_filter(query.who, query.filter, now)
        n = max(self._policy.candidates, query.limit)
        hot = None if query.filter.include_retired else await self._hot.view(query.who)
        mask = mask_for(hot, query.filter, now) if hot is not None else None
        if mask is not None and not mask.any():
            return []  # nothing the caller may see passes the filter: no query to embed, no index to ask
        # A query vector without text (SearchMemories.query_vector): vector-only recall.
        want_keywords = query.mode is not SearchMode.VECTOR and bool(text)
        want_vectors = query.mode is not SearchMode.KEYWORD
        sub = await self._sub_query(text, hot) if given is None and want_vectors else None
        keyword_task = self._keyword_hits(text, where, n, hot, mask) if want_keywords else _no_hits()
        vector_task = (
            self._vector_hits(text, where, n, hot, mask, given=given, sub=sub)
            if want_vectors
            else _no_vector_hits()
        )
        keyword_hits, (vector_hits, expanded) = await asyncio.gather(keyword_task, vector_task)
        ranked = fuse_and_rank(
            keyword_hits,
            vector_hits,
            policy=self._policy,
            now_ms=now,
            limit=max(n, query.limit),
            min_score=query.min_score,
            expanded=expanded,
        )
        return focus(text, ranked, query.limit)  # who the query names (ltm/recall.py)

    async def _keyword_hits(
        self, text: str, where: Expr, n: int, hot: HotEntry | None, mask: npt.NDArray[np.bool_] | None
    ) -> list[Hit]:
        """BM25 over the reader's entry in memory (ltm/hot.py), else LanceDB's full-text index."""
        if hot is not None and mask is not None:
            return await hot.keyword_top(mask, text, n)
        return await self._store.keyword_search(text, where, n)

    async def _sub_query(self, text: str, hot: HotEntry | None) -> SubQuery | None:
        """Expansion needs the in-memory index (ltm/recall.py); a sidecar without it, or a reader
        too big for its budget, is served without."""
        if hot is None or self._policy.expansion_weight <= 0.0:
            return None
        return sub_query(text, await hot.speaker_index())

    async def _vector_hits(
        self,
        text: str,
        where: Expr,
        n: int,
        hot: HotEntry | None,
        mask: npt.NDArray[np.bool_] | None,
        *,
        given: npt.NDArray[np.float32] | None = None,
        sub: SubQuery | None = None,
    ) -> tuple[list[Hit], list[list[Hit]]]:
        """The vector hits, and the named speakers' own (expansion). One text is embedded: the query,
        or the topic of a query that names speakers."""
        vector = given if given is not None else (await self._embedder.embed([sub.text if sub else text]))[0]
        if hot is None or mask is None:
            return await self._store.vector_search(vector, where, n), []
        expanded = [speaker_hits(hot, mask, sub, vector, n)] if sub is not None else []
        return hot.top(mask, vector, n), expanded

    async def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """The embedder's vectors of ``texts`` (Embed): what memories are indexed with."""
        return await embed_texts(self._embedder, texts)

    async def profile(self, who: Visibility, *, max_items: int = 0, max_chars: int = 0) -> Profile:
        """Instructions, preferences and stable facts to inject every turn, capped by count and size."""
        max_items = max_items or self._policy.profile_max_items
        max_chars = max_chars or self._policy.profile_max_chars
        self._store.check_intact()  # nor a cached profile
        await self.freshness.current(who.user_id)
        now = self._clock()
        flt = MemoryFilter(kinds=[MemoryKind.INSTRUCTION, MemoryKind.PREFERENCE, MemoryKind.FACT])
        hot = await self._hot.view(who)
        if hot is not None:
            items = hot.items(mask_for(hot, flt, now))
        else:
            items = await self._store.fetch(filters.recall_filter(who, flt, now))
        kind_order = {MemoryKind.INSTRUCTION: 0, MemoryKind.PREFERENCE: 1, MemoryKind.FACT: 2}
        # Within a kind: single-valued attributes (name, location, units) first, they are the profile.
        items.sort(
            key=lambda i: (kind_order[i.kind], i.slot == "", -i.importance, -i.usage_count, -i.updated_at_ms)
        )
        profile = Profile()
        used = 0
        said: set[str] = set()
        for item in _newest_per_slot(items):
            if len(profile.items()) >= max_items:
                break
            if text_key(item.content) in said:
                continue  # one fact written by two agents: shown once
            said.add(text_key(item.content))
            if used + len(item.content) > max_chars:
                continue
            used += len(item.content)
            {
                MemoryKind.INSTRUCTION: profile.instructions,
                MemoryKind.PREFERENCE: profile.preferences,
                MemoryKind.FACT: profile.facts,
            }[item.kind].append(item)
        return profile

    async def bump_usage(self, ids: list[str]) -> None:
        """Count one use of each id (items injected into a context). Returns at once; written in batches."""
        self._usage.record(ids)

    async def flush_usage(self) -> None:
        await self._usage.flush()

    # ----------------------------------------------------------------------------------- CRUD

    async def get(self, who: Visibility, memory_id: str) -> MemoryItem:
        """One item the caller may read, retired ones included (the viewer shows history)."""
        await self.freshness.current(who.user_id)
        found = await self._store.fetch(readable(who) & filters.with_id(memory_id), limit=1)
        if not found:
            raise NotFound(f"memory {memory_id} not found")
        return found[0]

    async def list_items(
        self, who: Visibility, flt: MemoryFilter, *, page_size: int = 0, page_token: str = ""
    ) -> MemoryPage:
        """Newest first, keyset-paginated (a token stays valid while items are added or deleted)."""
        await self.freshness.current(who.user_id)
        where = filters.narrowed(readable(who), flt, self._clock())
        return await list_page(self._store, who, flt, where, size=page_size, token=page_token)

    async def update(self, who: Visibility, memory_id: str, patch: MemoryPatch) -> MemoryItem:
        item = await self.get(who, memory_id)
        now = self._clock()
        if patch.content is not None and patch.content.strip() != item.content:
            item.content = self._check_content(patch.content)
            item.vector = (await self._embedder.embed([embedding_text(item.content, item.keywords)]))[
                0
            ].tolist()
        else:
            item.vector = await self._vector_of(who.user_id, item.id)
        if patch.keywords is not None:
            item.keywords = clean_keywords(patch.keywords)
        if patch.importance is not None:
            item.importance = clamp(patch.importance)
        if patch.kind is not None:
            item.kind = MemoryKind(patch.kind)
        if patch.scope is not None:
            item.scope = MemoryScope(patch.scope)
        if patch.slot is not None:
            item.slot = canonical_slot(patch.slot)
        if patch.metadata is not None:
            item.metadata = dict(patch.metadata)
        if patch.valid_until_ms is not None:
            item.valid_until_ms = max(0, patch.valid_until_ms)
        if item.scope is MemoryScope.GROUP and not item.group:
            raise InvalidArgument("a group-scoped memory needs a group")
        item.updated_at_ms = now
        await self._store.upsert([item])
        await self._journal(who.user_id, who.agent_id, [Change(replace(item, vector=[]), ChangeReason.EDIT)])
        await self._changed(who.user_id)
        return replace(item, vector=[])

    async def _vector_of(self, user_id: str, memory_id: str) -> list[float]:
        where = filters.owned_by(user_id) & filters.with_id(memory_id)
        rows = await self._store.fetch(where, with_vector=True, limit=1)
        return rows[0].vector if rows else []

    async def delete(self, who: Visibility, memory_id: str) -> None:
        item = await self.get(who, memory_id)  # NotFound unless the caller may see it
        await self._store.delete(filters.owned_by(who.user_id) & filters.with_id(memory_id))
        await self._journal(who.user_id, who.agent_id, [Change(item, ChangeReason.DELETE, deleted=True)])
        await self._changed(who.user_id, removed=True)

    async def feedback(self, who: Visibility, memory_id: str, verdict: Feedback) -> MemoryItem:
        """USEFUL raises importance and counts a use; WRONG lowers it and retires the item at once
        (kept for audit like a superseded one, never served again)."""
        item = await self.get(who, memory_id)
        now = self._clock()
        if verdict is Feedback.USEFUL:
            item.useful_count += 1
            item.usage_count += 1
            item.last_used_at_ms = now
            item.importance = clamp(item.importance + self._policy.useful_importance_step)
        else:
            item.wrong_count += 1
            item.importance = clamp(item.importance - self._policy.wrong_importance_step)
            item.valid_until_ms = now
        item.updated_at_ms = now
        values = {
            "useful_count": str(item.useful_count),
            "wrong_count": str(item.wrong_count),
            "usage_count": str(item.usage_count),
            "last_used_at_ms": str(item.last_used_at_ms),
            "importance": repr(float(item.importance)),
            "valid_until_ms": str(item.valid_until_ms),
            "updated_at_ms": str(now),
        }
        await self._store.update(filters.owned_by(who.user_id) & filters.with_id(memory_id), values)
        await self._journal(who.user_id, who.agent_id, [Change(item, ChangeReason.FEEDBACK)])
        await self._changed(who.user_id)
        return item

    async def close(self) -> None:
        """Flush pending usage bumps. The store and embedder are closed by their owner (app.py)."""
        await self._usage.close()


async def _no_hits() -> list[Hit]:
    return []


async def _no_vector_hits() -> tuple[list[Hit], list[list[Hit]]]:
    return [], []


def _newest_per_slot(items: list[MemoryItem]) -> list[MemoryItem]:
    """``items`` (in order) with one item per single-valued attribute of one subject: the newest. Ingest
    supersedes within one (user, agent); the profile also reads other agents' user-wide items, and two
    homes must not reach the model side by side whoever wrote them."""
    slots = [stated_slot(i.slot, i.content) for i in items]
    newest: dict[tuple[str, str], MemoryItem] = {}
    for item, slot in zip(items, slots, strict=True):
        if slot:
            key = (subject_of(item.metadata), slot)
            kept = newest.get(key)
            if kept is None or (item.updated_at_ms, item.id) > (kept.updated_at_ms, kept.id):
                newest[key] = item
    winners = {id(i) for i in newest.values()}
    return [i for i, slot in zip(items, slots, strict=True) if not slot or id(i) in winners]


def readable(who: Visibility) -> Expr:
    """CRUD visibility: an agent sees what recall would show it; no agent id means the user's own
    memory viewer, which sees every item of that user."""
    return filters.visible_to(who) if who.agent_id else filters.owned_by(who.user_id)


def reads(who: Visibility, item: MemoryItem) -> bool:
    """``readable`` over one item held in memory (a snapshot's): the same rule, kept beside it."""
    if item.user_id != who.user_id:
        return False
    if not who.agent_id or item.scope in (MemoryScope.USER, MemoryScope.SHARED):
        return True
    if item.scope is MemoryScope.AGENT:
        return item.agent_id == who.agent_id
    return item.scope is MemoryScope.GROUP and bool(item.group) and item.group in who.groups


# --- ListMemories' pages: newest first by (created_at_ms, id digest), keyset-paginated inside LanceDB.

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


def page_query(who: Visibility, flt: MemoryFilter) -> str:
    """What a ListMemories token is bound to: the reader and every filter field."""
    return query_fingerprint(
        "memories",
        who.user_id,
        who.agent_id,
        sorted(set(who.groups)),
        sorted({MemoryKind(k).value for k in flt.kinds}),
        sorted({MemoryScope(s).value for s in flt.scopes}),
        flt.channel,
        flt.episodes_from_channel,
        flt.episodes_not_from_session,
        flt.since_ms,
        flt.until_ms,
        flt.include_retired,
    )


async def list_page(
    store: LanceMemoryStore, who: Visibility, flt: MemoryFilter, where: Expr, *, size: int, token: str
) -> MemoryPage:
    """One page of the items ``where`` matches (the reader's visibility and ``flt``, already built)."""
    size = page_size(size, default=DEFAULT_PAGE_SIZE, maximum=MAX_PAGE_SIZE)
    query = page_query(who, flt)
    cursor = decode_token(token, query)
    total = await store.count(where)
    if cursor is not None:
        created, last_id = cursor_of(cursor, int, str)
        where = where & filters.after_cursor(created, last_id)
    keys = await store.newest_keys(where, size + 1)
    more = len(keys) > size
    keys = keys[:size]
    found = await store.fetch(where & filters.with_ids([i for _, i in keys])) if keys else []
    # Back in page order; an item deleted between the two reads is simply absent.
    by_id = {i.id: i for i in found}
    items = [by_id[i] for _, i in keys if i in by_id]
    page = items[: fitting(_item_bytes(i) for i in items)]
    if len(page) < len(items):  # the byte bound ended the page: go on after its last item
        return MemoryPage(page, encode_token(query, [page[-1].created_at_ms, page[-1].id]), total)
    return MemoryPage(page, encode_token(query, list(keys[-1])) if more else "", total)


def _item_bytes(item: MemoryItem) -> int:
    """About what one item weighs on the wire: its strings plus a fixed allowance for ids and numbers."""
    strings = [item.content, *item.keywords, *item.metadata.keys(), *item.metadata.values()]
    return 256 + sum(len(s.encode()) for s in strings)
