"""``MemoryService``: the domain face of long-term memory (see the package docstring for the API)."""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import numpy.typing as npt
import orjson
from lancedb.expr import Expr

from memlane_server.embedding import Embedder
from memlane_server.errors import AlreadyExists, InvalidArgument, NotFound
from memlane_server.ltm import filters
from memlane_server.ltm.conflicts import Action, Decision, decide
from memlane_server.ltm.focus import focus
from memlane_server.ltm.model import (
    Feedback,
    IngestOutcome,
    IngestResult,
    MemoryDraft,
    MemoryFilter,
    MemoryItem,
    MemoryKind,
    MemoryPage,
    MemoryPatch,
    MemoryScope,
    NewMemory,
    Owner,
    Profile,
    RecallQuery,
    ScoredMemory,
    SearchMode,
    Visibility,
    new_memory_id,
)
from memlane_server.ltm.policy import DAY_MS, MemoryPolicy, default_scope
from memlane_server.ltm.ranking import fuse_and_rank, prune_score
from memlane_server.ltm.store import Hit, LanceMemoryStore
from memlane_server.ltm.usage import UsageRecorder
from memlane_server.page_bytes import fitting

log = logging.getLogger(__name__)

MAX_CONTENT_CHARS = 4000
MAX_QUERY_CHARS = 2000
MAX_LIMIT = 100
MAX_PAGE_SIZE = 500
_LOCK_STRIPES = 64
_DELETE_BATCH = 1000

# Returns the kinds of personal data found in a text (empty when clean). Injected by app.py so the
# storage boundary enforces the PII rule whoever wrote the item, without ltm importing extraction.
ContentGuard = Callable[[str], list[str]]


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)
class PruneReport:
    over_cap: int = 0
    unused: int = 0
    retired: int = 0

    @property
    def total(self) -> int:
        return self.over_cap + self.unused + self.retired


class MemoryService:
    def __init__(
        self,
        store: LanceMemoryStore,
        embedder: Embedder,
        policy: MemoryPolicy | None = None,
        *,
        guard: ContentGuard | None = None,
        clock: Callable[[], int] = _now_ms,
        usage_flush_interval_s: float = 1.0,
        on_change: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self._store = store
        self._embedder = embedder
        self._policy = policy or MemoryPolicy()
        self._guard = guard
        self._clock = clock
        self._usage = UsageRecorder(store, flush_interval_s=usage_flush_interval_s)
        # Called with a user id after each write that changes what the user's reads return (not usage
        # counts), once the write is visible: caches of injected memories invalidate on it.
        self._on_change = on_change
        # Striped locks serialize ingest per (user, agent), so two concurrent promotions cannot both
        # decide "insert" for the same fact; unrelated users rarely share a stripe.
        self._locks = [asyncio.Lock() for _ in range(_LOCK_STRIPES)]

    @property
    def store(self) -> LanceMemoryStore:
        return self._store

    @property
    def policy(self) -> MemoryPolicy:
        return self._policy

    # ----------------------------------------------------------------------------------- recall

    async def search(self, query: RecallQuery) -> list[ScoredMemory]:
        """Hybrid recall over the memories ``query.who`` may see; best first, each with its score parts."""
        text = query.text.strip()
        if not text:
            raise InvalidArgument("query is required")
        if len(text) > MAX_QUERY_CHARS:
            raise InvalidArgument(f"query is longer than {MAX_QUERY_CHARS} characters")
        if not 1 <= query.limit <= MAX_LIMIT:
            raise InvalidArgument(f"limit must be between 1 and {MAX_LIMIT}")
        now = self._clock()
        where = filters.recall_filter(query.who, query.filter, now)
        n = max(self._policy.candidates, query.limit)
        keyword_hits: list[Hit] = []
        vector_hits: list[Hit] = []
        if query.mode is SearchMode.KEYWORD:
            keyword_hits = await self._store.keyword_search(text, where, n)
        elif query.mode is SearchMode.VECTOR:
            vector_hits = await self._vector_hits(text, where, n)
        else:
            keyword_hits, vector_hits = await asyncio.gather(
                self._store.keyword_search(text, where, n), self._vector_hits(text, where, n)
            )
        ranked = fuse_and_rank(
            keyword_hits,
            vector_hits,
            policy=self._policy,
            now_ms=now,
            limit=max(n, query.limit),
            min_score=query.min_score,
        )
        return focus(text, ranked, query.limit)  # who the query names (ltm/focus.py)

    async def _vector_hits(self, text: str, where: Expr, n: int) -> list[Hit]:
        vector = (await self._embedder.embed([text]))[0]
        return await self._store.vector_search(vector, where, n)

    async def profile(self, who: Visibility, *, max_items: int = 0, max_chars: int = 0) -> Profile:
        """Instructions, preferences and stable facts to inject every turn, capped by count and size."""
        max_items = max_items or self._policy.profile_max_items
        max_chars = max_chars or self._policy.profile_max_chars
        now = self._clock()
        flt = MemoryFilter(kinds=[MemoryKind.INSTRUCTION, MemoryKind.PREFERENCE, MemoryKind.FACT])
        items = await self._store.fetch(filters.recall_filter(who, flt, now))
        kind_order = {MemoryKind.INSTRUCTION: 0, MemoryKind.PREFERENCE: 1, MemoryKind.FACT: 2}
        # Within a kind: single-valued attributes (name, location, units) first, they are the profile.
        items.sort(
            key=lambda i: (kind_order[i.kind], i.slot == "", -i.importance, -i.usage_count, -i.updated_at_ms)
        )
        profile = Profile()
        used = 0
        for item in items:
            if len(profile.items()) >= max_items:
                break
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

    # ----------------------------------------------------------------------------------- writes

    async def create(self, owner: Owner, draft: NewMemory) -> IngestResult:
        """CreateMemory: one item, through the same merge/supersede rules as promotion."""
        self._check_content(draft.content)
        if draft.memory_id:
            found = await self._store.fetch(filters.with_id(draft.memory_id), limit=1)
            if found:
                same = found[0]
                if same.user_id == owner.user_id and same.content == draft.content.strip():
                    return IngestResult(same, IngestOutcome.CREATED)
                raise AlreadyExists(f"memory {draft.memory_id} already exists")
        results = await self.ingest(owner, [draft], strict=True)
        return results[0]

    async def ingest(
        self, owner: Owner, drafts: Sequence[MemoryDraft], *, strict: bool = False
    ) -> list[IngestResult]:
        """Store candidate memories (promotion, ExtractMemories): dedupe, supersede, cap. One write batch.

        Drafts that fail validation (empty, too long, PII) are skipped, or raise when ``strict``.
        Drafts may be ``NewMemory`` or any object with the ``MemoryDraft`` attributes.
        """
        user_id = owner.user_id
        if not user_id:
            raise InvalidArgument("user_id is required")
        accepted: list[tuple[MemoryDraft, MemoryKind, str]] = []
        for draft in drafts:
            try:
                kind = MemoryKind(draft.kind)
                content = self._check_content(draft.content)
            except (ValueError, InvalidArgument) as exc:
                if strict:
                    raise InvalidArgument(str(exc)) from exc
                log.info("skipping memory draft: %s", exc)
                continue
            accepted.append((draft, kind, content))
        if not accepted:
            return []
        vectors = await self._embedder.embed([embedding_text(c, d.keywords) for d, _, c in accepted])
        now = self._clock()
        async with self._locks[hash((user_id, owner.agent_id)) % _LOCK_STRIPES]:
            results = await self._ingest_locked(owner, accepted, vectors, now)
        await self._changed(user_id)
        return results

    async def _changed(self, *user_ids: str) -> None:
        if self._on_change is not None:
            for user_id in user_ids:
                await self._on_change(user_id)

    async def _ingest_locked(
        self,
        owner: Owner,
        accepted: list[tuple[MemoryDraft, MemoryKind, str]],
        vectors: npt.NDArray[np.float32],
        now: int,
    ) -> list[IngestResult]:
        similarity = self._policy.duplicate_similarity
        mine = filters.written_by(owner.user_id, owner.agent_id) & filters.active(now)
        existing = await self._store.fetch(mine & ~filters.of_kind(MemoryKind.EPISODIC), with_vector=True)
        ndims = self._embedder.ndims
        matrix = (
            np.asarray([e.vector for e in existing], dtype=np.float32)
            if existing
            else np.zeros((0, ndims), np.float32)
        )
        seen_turns: dict[str, MemoryItem] = {}
        if owner.source_session_id and any(k is MemoryKind.EPISODIC for _, k, _ in accepted):
            episodes = await self._store.fetch(
                mine
                & filters.of_kind(MemoryKind.EPISODIC)
                & filters.is_("source_session_id", owner.source_session_id)
            )
            seen_turns = {mid: ep for ep in episodes for mid in ep.source_message_ids[:1]}

        new_items: dict[str, MemoryItem] = {}
        changed: dict[str, MemoryItem] = {}
        results: list[IngestResult] = []
        for (draft, kind, content), vector in zip(accepted, vectors, strict=True):
            if kind is MemoryKind.EPISODIC and draft.source_message_ids[:1]:
                prior = seen_turns.get(draft.source_message_ids[0])
                if prior is not None:
                    results.append(IngestResult(prior, IngestOutcome.SKIPPED))
                    continue
            # A draft may retire (supersede) only items whose readers could all read where it came from.
            peers = [i for i, e in enumerate(existing) if _may_change(draft, e)]
            among = partial(
                _decide, draft, kind, content, vector, existing=existing, matrix=matrix, similarity=similarity
            )
            decision = among(peers=peers)
            audience = _draft_audience(draft, kind)
            if decision.target is not None and _item_audience(decision.target) != audience:
                # A merge (rewording) keeps its readers: folded into an item for other readers, the draft
                # would be published (narrow into wide) or hidden from its own readers (wide into narrow).
                same = [i for i in peers if _item_audience(existing[i]) == audience]
                decision = among(peers=same)
            if decision.action is Action.MERGE and decision.target is not None:
                target = decision.target
                self._merge_into(target, draft, kind=kind, content=content, vector=vector, now=now)
                matrix[existing.index(target)] = vector
                if target.id not in new_items:
                    changed[target.id] = target
                results.append(IngestResult(target, IngestOutcome.MERGED))
                continue
            item = self._new_item(owner, draft, kind=kind, content=content, vector=vector, now=now)
            new_items[item.id] = item
            retired_ids: list[str] = []
            for old in decision.retire:
                old.superseded_by = item.id
                old.valid_until_ms = now
                old.updated_at_ms = now
                retired_ids.append(old.id)
                if old.id not in new_items:
                    changed[old.id] = old
                keep = [i for i, e in enumerate(existing) if e.id != old.id]
                existing = [existing[i] for i in keep]
                matrix = matrix[keep]
            if kind is not MemoryKind.EPISODIC:
                existing.append(item)
                matrix = np.vstack([matrix, vector[None, :]])
            outcome = IngestOutcome.SUPERSEDED if retired_ids else IngestOutcome.CREATED
            results.append(IngestResult(item, outcome, retired_ids))

        await self._store.add([i for i in new_items.values() if i.is_active(now) or i.superseded_by])
        await self._store.upsert(list(changed.values()))
        await self._enforce_caps(owner, existing, now)
        return results

    def _new_item(
        self,
        owner: Owner,
        draft: MemoryDraft,
        *,
        kind: MemoryKind,
        content: str,
        vector: npt.NDArray[np.float32],
        now: int,
    ) -> MemoryItem:
        extra = draft if isinstance(draft, NewMemory) else None
        scope = MemoryScope(extra.scope) if extra and extra.scope else default_scope(kind)
        if scope is MemoryScope.GROUP and not (extra and extra.group):
            raise InvalidArgument("a group-scoped memory needs a group")
        return MemoryItem(
            id=(extra.memory_id if extra and extra.memory_id else new_memory_id(now)),
            user_id=owner.user_id,
            agent_id=owner.agent_id,
            scope=scope,
            kind=kind,
            content=content,
            keywords=_clean_keywords(draft.keywords),
            slot=draft.slot,
            group=extra.group if extra else "",
            importance=_clamp(draft.importance),
            created_at_ms=now,
            updated_at_ms=now,
            occurred_at_ms=draft.occurred_at_ms or now,
            source_session_id=owner.source_session_id,
            source_message_ids=list(draft.source_message_ids)[: self._policy.max_source_ids],
            channel=owner.channel,
            valid_until_ms=extra.valid_until_ms if extra else 0,
            metadata=dict(extra.metadata) if extra else {},
            vector=vector.tolist(),
        )

    def _merge_into(
        self,
        target: MemoryItem,
        draft: MemoryDraft,
        *,
        kind: MemoryKind,
        content: str,
        vector: npt.NDArray[np.float32],
        now: int,
    ) -> None:
        """Newest wording wins; importance and usage carry over; provenance accumulates."""
        target.content = content
        target.kind = kind
        target.vector = vector.tolist()
        target.slot = draft.slot or target.slot
        target.importance = max(target.importance, _clamp(draft.importance))
        target.keywords = _clean_keywords([*draft.keywords, *target.keywords])
        ids = list(dict.fromkeys([*target.source_message_ids, *draft.source_message_ids]))
        target.source_message_ids = ids[-self._policy.max_source_ids :]
        target.updated_at_ms = now

    async def _enforce_caps(self, owner: Owner, active_facts: list[MemoryItem], now: int) -> None:
        """Hard cap per (user, agent): drop the lowest prune scores over the cap, right away."""
        doomed: list[str] = []
        over = len(active_facts) - self._policy.max_items_per_agent
        if over > 0:
            ranked = sorted(active_facts, key=lambda i: (prune_score(i, now, self._policy), i.updated_at_ms))
            doomed.extend(i.id for i in ranked[:over])
        episodic = filters.written_by(owner.user_id, owner.agent_id) & filters.of_kind(MemoryKind.EPISODIC)
        if await self._store.count(episodic) > self._policy.max_episodes_per_agent:
            episodes = await self._store.fetch(episodic)
            ranked = sorted(episodes, key=lambda i: (prune_score(i, now, self._policy), i.occurred_at_ms))
            doomed.extend(i.id for i in ranked[: len(episodes) - self._policy.max_episodes_per_agent])
        for start in range(0, len(doomed), _DELETE_BATCH):
            await self._store.delete(filters.with_ids(doomed[start : start + _DELETE_BATCH]))

    # ----------------------------------------------------------------------------------- CRUD

    async def get(self, who: Visibility, memory_id: str) -> MemoryItem:
        """One item the caller may read, retired ones included (the viewer shows history)."""
        found = await self._store.fetch(_readable(who) & filters.with_id(memory_id), limit=1)
        if not found:
            raise NotFound(f"memory {memory_id} not found")
        return found[0]

    async def list_items(
        self, who: Visibility, flt: MemoryFilter, *, page_size: int = 50, page_token: str = ""
    ) -> MemoryPage:
        """Newest first, keyset-paginated (a token stays valid while items are added or deleted)."""
        if not 0 <= page_size <= MAX_PAGE_SIZE:
            raise InvalidArgument(f"page_size must be between 0 and {MAX_PAGE_SIZE}")
        page_size = page_size or 50
        where = filters.narrowed(_readable(who), flt, self._clock())
        total = await self._store.count(where)
        if page_token:
            created, last_id = _decode_token(page_token)
            where = where & filters.after_cursor(created, last_id)
        items = await self._store.fetch(where)
        items.sort(key=lambda i: filters.page_order(i.created_at_ms, i.id), reverse=True)
        page = items[: fitting(_item_bytes(i) for i in items[:page_size])]
        token = _encode_token(page[-1]) if len(items) > len(page) else ""
        return MemoryPage(page, token, total)

    async def update(self, who: Visibility, memory_id: str, patch: MemoryPatch) -> MemoryItem:
        item = await self.get(who, memory_id)
        now = self._clock()
        if patch.content is not None and patch.content.strip() != item.content:
            item.content = self._check_content(patch.content)
            item.vector = (await self._embedder.embed([embedding_text(item.content, item.keywords)]))[
                0
            ].tolist()
        else:
            item.vector = await self._vector_of(item.id)
        if patch.keywords is not None:
            item.keywords = _clean_keywords(patch.keywords)
        if patch.importance is not None:
            item.importance = _clamp(patch.importance)
        if patch.kind is not None:
            item.kind = MemoryKind(patch.kind)
        if patch.scope is not None:
            item.scope = MemoryScope(patch.scope)
        if patch.slot is not None:
            item.slot = patch.slot
        if patch.metadata is not None:
            item.metadata = dict(patch.metadata)
        if patch.valid_until_ms is not None:
            item.valid_until_ms = max(0, patch.valid_until_ms)
        if item.scope is MemoryScope.GROUP and not item.group:
            raise InvalidArgument("a group-scoped memory needs a group")
        item.updated_at_ms = now
        await self._store.upsert([item])
        await self._changed(who.user_id)
        return replace(item, vector=[])

    async def _vector_of(self, memory_id: str) -> list[float]:
        rows = await self._store.fetch(filters.with_id(memory_id), with_vector=True, limit=1)
        return rows[0].vector if rows else []

    async def delete(self, who: Visibility, memory_id: str) -> None:
        await self.get(who, memory_id)  # NotFound unless the caller may see it
        await self._store.delete(filters.owned_by(who.user_id) & filters.with_id(memory_id))
        await self._changed(who.user_id)

    async def feedback(self, who: Visibility, memory_id: str, verdict: Feedback) -> MemoryItem:
        """USEFUL raises importance and counts a use; WRONG lowers it and retires the item at once
        (kept for audit like a superseded one, never served again)."""
        item = await self.get(who, memory_id)
        now = self._clock()
        if verdict is Feedback.USEFUL:
            item.useful_count += 1
            item.usage_count += 1
            item.last_used_at_ms = now
            item.importance = _clamp(item.importance + self._policy.useful_importance_step)
        else:
            item.wrong_count += 1
            item.importance = _clamp(item.importance - self._policy.wrong_importance_step)
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
        await self._changed(who.user_id)
        return item

    # ----------------------------------------------------------------------------------- upkeep

    async def prune(self, now_ms: int | None = None) -> PruneReport:
        """The scheduled pruning job: over-cap items, old never-used items, expired audit records."""
        now = self._clock() if now_ms is None else now_ms
        policy = self._policy
        report = PruneReport()
        all_items = await self._store.fetch_columns(None, _PRUNE_COLUMNS)
        items = [_prune_view(r) for r in all_items.to_pylist()]
        doomed: set[str] = set()
        unused_before = now - int(policy.unused_ttl_days * DAY_MS)
        retired_before = now - int(policy.retired_retention_days * DAY_MS)
        groups: dict[tuple[str, str, bool], list[MemoryItem]] = {}
        for item in items:
            if not item.is_active(now):
                if item.valid_until_ms and item.valid_until_ms < retired_before:
                    doomed.add(item.id)
                    report.retired += 1
                continue
            if (
                item.usage_count == 0
                and item.created_at_ms < unused_before
                and item.importance < policy.unused_keep_importance
            ):
                doomed.add(item.id)
                report.unused += 1
                continue
            key = (item.user_id, item.agent_id, item.kind is MemoryKind.EPISODIC)
            groups.setdefault(key, []).append(item)
        for (_, _, episodic), members in groups.items():
            cap = policy.max_episodes_per_agent if episodic else policy.max_items_per_agent
            if len(members) > cap:
                ranked = sorted(members, key=lambda i: (prune_score(i, now, policy), i.updated_at_ms))
                extra = ranked[: len(members) - cap]
                doomed.update(i.id for i in extra)
                report.over_cap += len(extra)
        ids = sorted(doomed)
        for start in range(0, len(ids), _DELETE_BATCH):
            await self._store.delete(filters.with_ids(ids[start : start + _DELETE_BATCH]))
        await self._changed(*sorted({i.user_id for i in items if i.id in doomed}))
        return report

    async def optimize(self) -> None:
        await self._store.optimize()

    # ------------------------------------------------------------------- per-user export and erasure

    async def export_user(self, user_id: str) -> list[MemoryItem]:
        """Every item of the user, retired ones included (an export hides nothing)."""
        return await self._store.fetch(filters.owned_by(user_id))

    async def erase_user(self, user_id: str) -> int:
        """Deletes the user's items so that no byte of them stays on disk (see ``LanceMemoryStore.erase``).
        Returns how many items there were."""
        await self._usage.flush()  # a pending usage bump must not resurrect a row after the delete
        n = await self._store.erase(filters.owned_by(user_id))
        self._embedder.forget_cached()
        await self._changed(user_id)
        return n

    async def close(self) -> None:
        """Flush pending usage bumps. The store and embedder are closed by their owner (app.py)."""
        await self._usage.close()

    def _check_content(self, content: str) -> str:
        text = content.strip()
        if not text:
            raise InvalidArgument("content is required")
        if len(text) > MAX_CONTENT_CHARS:
            raise InvalidArgument(f"content is longer than {MAX_CONTENT_CHARS} characters")
        if self._guard is not None:
            found = self._guard(text)
            if found:
                raise InvalidArgument(f"content holds personal data ({', '.join(found)}); not stored")
        return text


_PRUNE_COLUMNS = [
    "id",
    "user_id",
    "agent_id",
    "kind",
    "importance",
    "usage_count",
    "last_used_at_ms",
    "created_at_ms",
    "updated_at_ms",
    "occurred_at_ms",
    "superseded_by",
    "valid_until_ms",
]


def _prune_view(row: dict[str, object]) -> MemoryItem:
    def num(name: str) -> int:
        value = row.get(name)
        return int(value) if isinstance(value, int | float) else 0

    return MemoryItem(
        id=str(row["id"]),
        user_id=str(row["user_id"]),
        agent_id=str(row.get("agent_id") or ""),
        scope=MemoryScope.USER,
        kind=MemoryKind(str(row.get("kind") or MemoryKind.FACT.value)),
        content="",
        importance=float(row.get("importance") or 0.0),  # type: ignore[arg-type]
        usage_count=num("usage_count"),
        last_used_at_ms=num("last_used_at_ms"),
        created_at_ms=num("created_at_ms"),
        updated_at_ms=num("updated_at_ms"),
        occurred_at_ms=num("occurred_at_ms"),
        superseded_by=str(row.get("superseded_by") or ""),
        valid_until_ms=num("valid_until_ms"),
    )


def _audience(scope: MemoryScope, group: str) -> tuple[MemoryScope, str]:
    """Who reads an item of the writing agent with this scope: USER and SHARED reach the same agents."""
    if scope is MemoryScope.SHARED:
        scope = MemoryScope.USER
    return scope, group if scope is MemoryScope.GROUP else ""


def _item_audience(item: MemoryItem) -> tuple[MemoryScope, str]:
    return _audience(item.scope, item.group)


def _decide(
    draft: MemoryDraft,
    kind: MemoryKind,
    content: str,
    vector: npt.NDArray[np.float32],
    *,
    peers: list[int],
    existing: list[MemoryItem],
    matrix: npt.NDArray[np.float32],
    similarity: float,
) -> Decision:
    """``decide`` over the ``peers`` (indexes into ``existing`` and its vector ``matrix``)."""
    return decide(
        kind,
        draft.slot,
        vector,
        content=content,
        existing=[existing[i] for i in peers],
        existing_vectors=matrix[peers],
        duplicate_similarity=similarity,
    )


def _draft_audience(draft: MemoryDraft, kind: MemoryKind) -> tuple[MemoryScope, str]:
    extra = draft if isinstance(draft, NewMemory) else None
    scope = MemoryScope(extra.scope) if extra and extra.scope else default_scope(kind)
    return _audience(scope, extra.group if extra else "")


def _may_change(draft: MemoryDraft, target: MemoryItem) -> bool:
    """Whether ``draft`` may supersede ``target`` (an item of the same user and agent).

    A draft with an explicit agent or group scope came from a narrower audience (an agent-private or a
    group turn: see ``pipelines.promote``); it may only change items no wider than that audience. A draft
    with the default or a user-wide scope may change any of the agent's items.
    """
    if not isinstance(draft, NewMemory) or not draft.scope:
        return True
    scope = MemoryScope(draft.scope)
    if scope is MemoryScope.GROUP:
        return target.scope is MemoryScope.AGENT or (
            target.scope is MemoryScope.GROUP and target.group == draft.group
        )
    return scope is not MemoryScope.AGENT or target.scope is MemoryScope.AGENT


def _readable(who: Visibility) -> Expr:
    """CRUD visibility: an agent sees what recall would show it; no agent id means the user's own
    memory viewer, which sees every item of that user."""
    return filters.visible_to(who) if who.agent_id else filters.owned_by(who.user_id)


def embedding_text(content: str, keywords: Sequence[str]) -> str:
    """What an item's vector is computed from: its content, then its keywords. Keywords are keys the
    content implies but may not say (an episode's neighbouring turns, a date); the vector model sees
    them as the full-text index does."""
    keys = " ".join(_clean_keywords(keywords))
    return f"{content}\n{keys}" if keys else content


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, float(value)))


def _clean_keywords(words: Sequence[str]) -> list[str]:
    out = list(dict.fromkeys(w.strip() for w in words if w and w.strip()))
    return out[:32]


def _encode_token(item: MemoryItem) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([item.created_at_ms, item.id])).decode()


def _decode_token(token: str) -> tuple[int, str]:
    try:
        created, last_id = orjson.loads(base64.urlsafe_b64decode(token.encode()))
        return int(created), str(last_id)
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError) as exc:
        raise InvalidArgument("page_token is not valid") from exc


def _item_bytes(item: MemoryItem) -> int:
    """About what one item weighs on the wire: its strings plus a fixed allowance for ids and numbers."""
    strings = [item.content, *item.keywords, *item.metadata.keys(), *item.metadata.values()]
    return 256 + sum(len(s.encode()) for s in strings)
