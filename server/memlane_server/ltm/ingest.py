"""Writes of new memories (promotion, ExtractMemories, CreateMemory): dedupe, merge, supersede, caps."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np
import numpy.typing as npt

from ..errors import AlreadyExists, InvalidArgument
from ..memory_kinds import MemoryDraft, MemoryKind, MemoryScope, default_scope
from . import filters
from .conflicts import (
    Action,
    Decision,
    Thresholds,
    decide,
    may_merge,
    may_retire_across,
    may_supersede,
    newest_wins,
    restates,
)
from .core import DELETE_BATCH, LOCK_STRIPES, MemoryCore, canonical_slot, stated_slot
from .history import Change, ChangeReason
from .model import (
    IngestOutcome,
    IngestResult,
    MemoryItem,
    NewMemory,
    Owner,
    id_unavailable,
    is_server_id,
    new_memory_id,
)
from .recall import STALE_KEY, prune_score, text_key
from .tuning import DAY_MS

_DAYS_PER_READ = 16  # days of drafted episodes read for twins in one predicate
log = logging.getLogger(__name__)


class MemoryWriter(MemoryCore):
    # ----------------------------------------------------------------------------------- writes

    async def create(self, owner: Owner, draft: NewMemory) -> IngestResult:
        """CreateMemory: one item, through the same merge/supersede rules as promotion."""
        self._check_content(draft.content)
        if draft.memory_id:
            mine = filters.owned_by(owner.user_id) & filters.with_id(draft.memory_id)
            found = await self._store.fetch(mine, limit=1)
            if found:
                if found[0].content == draft.content.strip():
                    return IngestResult(found[0], IngestOutcome.CREATED)  # a retry
                raise AlreadyExists(f"memory {draft.memory_id} already exists")
            # Not the caller's: one answer whether another user holds it or it is merely of the server's
            # shape (model.id_unavailable), so the refusal is no oracle of other users' ids. Both are
            # asked every time: a shortcut would answer the free one sooner.
            taken = await self._store.held_by_others(owner.user_id, [draft.memory_id])
            if taken or is_server_id(draft.memory_id):
                raise id_unavailable(draft.memory_id)
        results = await self.ingest(owner, [draft], strict=True, reason=ChangeReason.CREATE)
        return results[0]

    async def ingest(
        self,
        owner: Owner,
        drafts: Sequence[MemoryDraft],
        *,
        strict: bool = False,
        reason: ChangeReason = ChangeReason.EXTRACTION,
        learnt: bool = False,
    ) -> list[IngestResult]:
        """Store candidate memories (promotion, ExtractMemories): dedupe, supersede, cap. One write batch.
        ``learnt``: learning's write (promotion), which readers elsewhere take in behind their reads.

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
        accepted = await self._own_ids(owner, accepted, strict=strict)
        vectors = await self._embedder.embed([embedding_text(c, d.keywords) for d, _, c in accepted])
        if any(k is not MemoryKind.EPISODIC for _, k, _ in accepted):
            await self._slots.ready()
        # Per user, not per (user, agent): an ingest reads and may retire other agents' user-wide items
        # (``_load_peers``), so two agents' ingests of one user in this process must not interleave (both
        # deciding against the same old value, or one writing back a row the other just retired). The
        # time is read once held: the order of the user's writes is the order of their decisions.
        async with self._locks[hash(user_id) % LOCK_STRIPES]:
            now = self._clock()
            results, pruned = await self._ingest_locked(owner, accepted, vectors, now, reason)
        await self._changed(user_id, removed=pruned, learnt=learnt)
        return results

    async def _own_ids(
        self, owner: Owner, accepted: list[tuple[MemoryDraft, MemoryKind, str]], *, strict: bool
    ) -> list[tuple[MemoryDraft, MemoryKind, str]]:
        """Drafts whose chosen id another user holds: refused when ``strict`` (CreateMemory), else
        given a fresh id (promotion's ids are derived from the session: a squatted one must not stop
        the session's memories from being stored)."""
        chosen = [d.memory_id for d, _, _ in accepted if isinstance(d, NewMemory) and d.memory_id]
        taken = await self._store.held_by_others(owner.user_id, chosen) if chosen else set()
        if not taken:
            return accepted
        if strict:
            raise id_unavailable(min(taken))
        log.info("ingest: %d drafted id(s) held by another user, given fresh ids", len(taken))
        return [
            (replace(d, memory_id="") if isinstance(d, NewMemory) and d.memory_id in taken else d, k, c)
            for d, k, c in accepted
        ]

    async def _ingest_locked(
        self,
        owner: Owner,
        accepted: list[tuple[MemoryDraft, MemoryKind, str]],
        vectors: npt.NDArray[np.float32],
        now: int,
        reason: ChangeReason,
    ) -> tuple[list[IngestResult], bool]:
        # The attributes the drafts state: other agents' items meet a draft only in one of these.
        stating = {
            self._slots.slot_of(d.slot, c, v)
            for (d, k, c), v in zip(accepted, vectors, strict=True)
            if k is not MemoryKind.EPISODIC
        } - {""}
        peers, (seen_turns, twins), retired_by_turn = await asyncio.gather(
            self._load_peers(owner, now, stating=stating),
            self._load_episodes(owner, accepted, now),
            self._retired_statements(owner, accepted),
        )
        batch = _Batch()
        results: list[IngestResult] = []
        # Which durable items each turn stated, to link the turn's episode to them: this batch's, and the
        # agent's stored ones (a turn's facts are learnt at once, its episode comes in a later batch).
        stated: dict[str, list[MemoryItem]] = {}
        for item in peers.items:
            if item.agent_id == owner.agent_id:
                for mid in item.source_message_ids:
                    stated.setdefault(mid, []).append(item)
        for (draft, kind, content), vector in zip(accepted, vectors, strict=True):
            prior = seen_turns.get(draft.source_message_ids[0]) if _is_turn_episode(draft, kind) else None
            if prior is not None:
                results.append(IngestResult(prior, IngestOutcome.SKIPPED))
                continue
            twin = twins.get(text_key(content)) if kind is MemoryKind.EPISODIC else None
            if twin is not None and may_merge(draft, kind, twin):
                # The same words of the same speaker on the same day (an episode's text holds all three),
                # said again in another session: one memory, its provenance both turns.
                decision = Decision(Action.MERGE, target=twin)
            else:
                decision = self._decision(
                    draft, kind, content, vector, peers, agent_id=owner.agent_id, now=now
                )
            if decision.action is Action.MERGE and decision.target is not None:
                target = decision.target
                kept = self._merge_into(
                    target,
                    draft,
                    kind=kind,
                    content=content,
                    vector=vector,
                    now=now,
                    session=owner.source_session_id,
                )
                at = next((i for i, p in enumerate(peers.items) if p is target), None)
                if at is not None:  # a durable item: what later drafts are compared with changed
                    peers.matrix[at] = kept
                    peers.slots[at] = self._slots.slot_of(target.slot, target.content, kept)
                    _note_stated(stated, draft, target)
                batch.touch(target)
                results.append(IngestResult(target, IngestOutcome.MERGED))
                continue
            item = self._new_item(owner, draft, kind=kind, content=content, vector=vector, now=now)
            slot = "" if kind is MemoryKind.EPISODIC else self._slots.slot_of(item.slot, content, vector)
            if decision.retired_by is not None:  # said before another agent's newer value
                item.superseded_by = decision.retired_by.id
                item.valid_until_ms = now
            results.append(
                _insert(
                    item,
                    decision.retire,
                    kind=kind,
                    vector=vector,
                    slot=slot,
                    now=now,
                    peers=peers,
                    batch=batch,
                )
            )
            if kind is MemoryKind.EPISODIC:
                _link_episode(item, stated, batch)
                gone = retired_by_turn.get(item.source_message_ids[0]) if item.source_message_ids else None
                if gone is not None and not item.metadata.get(STALE_KEY):
                    item.metadata = {**item.metadata, STALE_KEY: gone}  # its fact was retired already
                twins.setdefault(text_key(content), item)
            else:
                _note_stated(stated, draft, item)
        await self._mark_stale_episodes(owner, batch, now)

        stored = [i for i in batch.new_items.values() if i.is_active(now) or i.superseded_by]
        await self._store.add(stored)
        await self._store.upsert(list(batch.changed.values()))
        own = [i for i in peers.items if i.agent_id == owner.agent_id]
        dropped = await self._enforce_caps(owner, own, now)
        await self._journal(owner.user_id, owner.agent_id, _changes(stored, batch, dropped, reason))
        return results, bool(dropped)

    async def _load_peers(self, owner: Owner, now: int, *, stating: set[str]) -> _Peers:
        """The active non-episodic items a draft is compared with, with their vectors: the (user,
        agent)'s own, and other agents' user-wide ones stating one of the slots ``stating``
        (``_load_others``)."""
        mine = filters.written_by(owner.user_id, owner.agent_id) & filters.active(now)
        own, others = await asyncio.gather(
            self._store.fetch(mine & ~filters.of_kind(MemoryKind.EPISODIC), with_vector=True),
            self._load_others(owner, now, stating),
        )
        existing = own + others
        ndims = self._embedder.ndims
        matrix = (
            np.asarray([e.vector for e in existing], dtype=np.float32)
            if existing
            else np.zeros((0, ndims), np.float32)
        )
        # Stored slots in their family's name too: items written before a name joined a family meet.
        slots = self._slots.slots_of([e.slot for e in existing], [e.content for e in existing], matrix)
        return _Peers(existing, matrix, slots)

    async def _load_others(self, owner: Owner, now: int, slots: set[str]) -> list[MemoryItem]:
        """Other agents' active user-wide items stating one of ``slots`` (stored or meant): the only
        ones of theirs a draft may change (a user-wide attribute has one answer whichever agent was
        told it; another agent's item is never merged into: ``conflicts``, "Across agents"). None read
        for drafts that state no attribute (most); else their slots are read from columns and the few
        whole rows fetched after: as whole rows, 600 of them cost an ingest 40 -> 108 ms p50
        (measured), mostly turning vectors into Python floats and back."""
        if not slots:
            return []
        theirs = filters.owned_by(owner.user_id) & ~filters.is_("agent_id", owner.agent_id)
        where = theirs & filters.user_wide() & filters.active(now) & ~filters.of_kind(MemoryKind.EPISODIC)
        table = await self._store.fetch_columns(where, ["id", "slot", "content", "vector"])
        if not table.num_rows:
            return []
        flat = table["vector"].combine_chunks().flatten().to_numpy(zero_copy_only=False)
        matrix = np.asarray(flat, dtype=np.float32).reshape(table.num_rows, -1)
        stated = self._slots.slots_of(
            table["slot"].to_pylist(), table["content"].to_pylist(), matrix, worded=False
        )
        ids = [i for i, slot in zip(table["id"].to_pylist(), stated, strict=True) if slot in slots]
        found: list[MemoryItem] = []
        for start in range(0, len(ids), DELETE_BATCH):
            chunk = filters.with_ids(ids[start : start + DELETE_BATCH])
            found += await self._store.fetch(where & chunk, with_vector=True)
        return found

    async def _retired_statements(
        self, owner: Owner, accepted: list[tuple[MemoryDraft, MemoryKind, str]]
    ) -> dict[str, str]:
        """For the turns of this session whose episodes are drafted here: the durable item each stated
        that is retired already, by the turn's message id. A turn's facts are learnt at once and its
        episode later: a fact it stated and a later turn retired meanwhile leaves the episode stale from
        its first write (within one batch, ``_link_episode`` sees that itself). One read, by the
        session's digest: a message id is caller text, never a predicate's literal."""
        session = owner.source_session_id
        turns = {d.source_message_ids[0] for d, k, _ in accepted if _is_turn_episode(d, k)}
        if not session or not turns:
            return {}
        where = (
            filters.written_by(owner.user_id, owner.agent_id)
            & filters.is_("source_session_id", session)
            & ~filters.not_superseded()
            & ~filters.of_kind(MemoryKind.EPISODIC)
        )
        return {
            mid: item.id
            for item in await self._store.fetch(where)
            for mid in item.source_message_ids
            if mid in turns
        }

    async def _load_episodes(
        self, owner: Owner, accepted: list[tuple[MemoryDraft, MemoryKind, str]], now: int
    ) -> tuple[dict[str, MemoryItem], dict[str, MemoryItem]]:
        """The (user, agent)'s active episodes a drafted one may repeat, in one read (per
        ``_DAYS_PER_READ`` days of drafts): those stored for this session's turns, by the turn's message
        id (a re-run must not add them twice), and those saying what a drafted episode says, by text. An
        episode's text holds its day, so only the drafts' days are read for the second (a filter on text
        would put caller text in a predicate: ``store.checked`` refuses that)."""
        drafted = [(d, c) for d, k, c in accepted if k is MemoryKind.EPISODIC]
        if not drafted:
            return {}, {}
        texts = {text_key(c) for _, c in drafted}
        days = sorted({(d.occurred_at_ms or now) // DAY_MS for d, _ in drafted})
        mine = (
            filters.written_by(owner.user_id, owner.agent_id)
            & filters.active(now)
            & filters.of_kind(MemoryKind.EPISODIC)
        )
        session = owner.source_session_id
        seen_turns: dict[str, MemoryItem] = {}
        twins: dict[str, MemoryItem] = {}
        for start in range(0, len(days), _DAYS_PER_READ):
            where = filters.occurred_on_days(days[start : start + _DAYS_PER_READ], DAY_MS)
            if session and not start:
                where = where | filters.is_("source_session_id", session)
            for ep in await self._store.fetch(mine & where, with_vector=True):
                if session and ep.source_session_id == session:
                    seen_turns.update({mid: ep for mid in ep.source_message_ids[:1]})
                if text_key(ep.content) in texts:
                    twins.setdefault(text_key(ep.content), ep)
        return seen_turns, twins

    async def _mark_stale_episodes(self, owner: Owner, batch: _Batch, now: int) -> None:
        """Episodes that carry a fact retired by this batch say what is no longer true: each is marked
        with the fact it carried (``STALE_KEY``), which recall down-ranks (``stale_episode_factor``).
        They stay episodes: what was said then is still what was said then."""
        retired = [i for i in batch.changed.values() if i.superseded_by and i.kind is not MemoryKind.EPISODIC]
        links = {eid: old.id for old in retired for eid in _linked_episodes(old)}
        if not links:
            return
        known = {i.id: i for i in batch.new_items.values()}
        missing = [eid for eid in links if eid not in known]
        for start in range(0, len(missing), DELETE_BATCH):
            # With vectors: the rows are written back whole.
            chunk = filters.owned_by(owner.user_id) & filters.with_ids(missing[start : start + DELETE_BATCH])
            for fetched in await self._store.fetch(chunk, with_vector=True):
                known[fetched.id] = fetched
        for eid, fact_id in links.items():
            ep = known.get(eid)
            if ep is None or not ep.is_active(now) or ep.metadata.get(STALE_KEY):
                continue
            ep.metadata = {**ep.metadata, STALE_KEY: fact_id}
            ep.updated_at_ms = now
            batch.touch(ep)

    def _decision(
        self,
        draft: MemoryDraft,
        kind: MemoryKind,
        content: str,
        vector: npt.NDArray[np.float32],
        peers: _Peers,
        *,
        agent_id: str,
        now: int,
    ) -> Decision:
        # The rules of ``conflicts``: supersede within the draft's source, merge for the same readers and
        # only into the agent's own items; another agent's item only user-wide, the newest said winning.
        existing = peers.items
        others = {e.id for e in existing if e.agent_id != agent_id}

        def may_retire(e: MemoryItem) -> bool:
            return may_retire_across(draft, kind, e) if e.id in others else may_supersede(draft, e)

        def may_fold(e: MemoryItem) -> bool:
            return e.id not in others and may_merge(draft, kind, e)

        # Never one person's fact against another's: compare only items of the same subject.
        who = subject_of(draft.metadata)
        allowed = [i for i, e in enumerate(existing) if may_retire(e) and subject_of(e.metadata) == who]
        among = partial(
            _decide,
            draft,
            kind,
            content,
            vector,
            existing=existing,
            matrix=peers.matrix,
            slots=peers.slots,
            thresholds=Thresholds(self._policy.duplicate_similarity, self._policy.paraphrase_similarity),
            slot="" if kind is MemoryKind.EPISODIC else self._slots.slot_of(draft.slot, content, vector),
            subject=who,
        )
        decision = among(peers=allowed)
        if decision.target is not None and not may_fold(decision.target):
            # A duplicate it may not fold into is left alone: decided again without it, other agents'
            # items still what it may retire; then, repeating another agent's value, among its own.
            decision = among(peers=[i for i in allowed if may_fold(existing[i]) or existing[i].id in others])
            if decision.target is not None and not may_fold(decision.target):
                decision = among(peers=[i for i in allowed if may_fold(existing[i])])
        return newest_wins(decision, draft.occurred_at_ms or now, others)  # as ``_new_item`` dates it

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
            keywords=clean_keywords(draft.keywords),
            slot="" if kind is MemoryKind.EPISODIC else stated_slot(draft.slot, content),
            group=extra.group if extra else "",
            importance=clamp(draft.importance),
            created_at_ms=now,
            updated_at_ms=now,
            occurred_at_ms=draft.occurred_at_ms or now,
            source_session_id=owner.source_session_id,
            source_message_ids=list(draft.source_message_ids)[: self._policy.max_source_ids],
            channel=owner.channel,
            valid_until_ms=extra.valid_until_ms if extra else 0,
            metadata={k: v for k, v in draft.metadata.items() if k != LINKS_KEY},
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
        session: str,
    ) -> npt.NDArray[np.float32]:
        """Newest wording wins, unless the older names more (a paraphrase that drops "France" from
        "Lives in Lyon, France." keeps the fuller wording); importance and usage carry over;
        provenance (message ids, the sessions it came from) accumulates. Returns the vector kept."""
        fuller_old = restates(content, target.content) and len(target.content) > len(content)
        if not fuller_old:
            target.content = content
            target.kind = kind
            target.vector = vector.tolist()
        target.slot = canonical_slot(draft.slot) or target.slot
        meta = {k: v for k, v in draft.metadata.items() if k not in (LINKS_KEY, SESSIONS_KEY)}
        target.metadata = {**target.metadata, **meta}
        fold_provenance(target, [session], draft.source_message_ids, self._policy.max_source_ids)
        target.importance = max(target.importance, clamp(draft.importance))
        target.keywords = clean_keywords([*draft.keywords, *target.keywords])
        target.updated_at_ms = now
        return np.asarray(target.vector, dtype=np.float32)

    async def _enforce_caps(self, owner: Owner, active_facts: list[MemoryItem], now: int) -> list[MemoryItem]:
        """Hard cap per (user, agent): drop the lowest prune scores over the cap, right away; returns them."""
        doomed: list[MemoryItem] = []
        over = len(active_facts) - self._policy.max_items_per_agent
        if over > 0:
            ranked = sorted(active_facts, key=lambda i: (prune_score(i, now, self._policy), i.updated_at_ms))
            doomed.extend(ranked[:over])
        episodic = filters.written_by(owner.user_id, owner.agent_id) & filters.of_kind(MemoryKind.EPISODIC)
        if await self._store.count(episodic) > self._policy.max_episodes_per_agent:
            episodes = await self._store.fetch(episodic)
            ranked = sorted(episodes, key=lambda i: (prune_score(i, now, self._policy), i.occurred_at_ms))
            doomed.extend(ranked[: len(episodes) - self._policy.max_episodes_per_agent])
        ids = [i.id for i in doomed]
        for start in range(0, len(ids), DELETE_BATCH):
            mine = filters.written_by(owner.user_id, owner.agent_id)
            await self._store.delete(mine & filters.with_ids(ids[start : start + DELETE_BATCH]))
        return doomed


@dataclass(slots=True)
class _Peers:
    """The items a draft is compared with (``_load_peers``: the agent's active non-episodic ones and
    other agents' user-wide ones that state an attribute), as ingest changes them, and their vectors
    row by row."""

    items: list[MemoryItem]
    matrix: npt.NDArray[np.float32]
    slots: list[str]  # per item: its slot, else the one recognised by meaning, else ""


@dataclass(slots=True)
class _Batch:
    """What one ingest writes: new rows, and changed existing rows (merged into or retired)."""

    new_items: dict[str, MemoryItem] = field(default_factory=dict)
    changed: dict[str, MemoryItem] = field(default_factory=dict)

    def touch(self, item: MemoryItem) -> None:
        if item.id not in self.new_items:
            self.changed[item.id] = item


def _changes(
    stored: list[MemoryItem], batch: _Batch, dropped: list[MemoryItem], reason: ChangeReason
) -> list[Change]:
    """The versions one ingest makes: new items (why: ``reason``), items merged into or superseded,
    items dropped by a cap."""
    journal = [Change(i, reason) for i in stored]
    journal += [
        Change(i, ChangeReason.SUPERSEDE if i.superseded_by else ChangeReason.MERGE)
        for i in batch.changed.values()
    ]
    journal += [Change(i, ChangeReason.PRUNE, deleted=True) for i in dropped]
    return journal


def _is_turn_episode(draft: MemoryDraft, kind: MemoryKind) -> bool:
    return kind is MemoryKind.EPISODIC and bool(draft.source_message_ids[:1])


def _insert(
    item: MemoryItem,
    retire: list[MemoryItem],
    *,
    kind: MemoryKind,
    vector: npt.NDArray[np.float32],
    slot: str,
    now: int,
    peers: _Peers,
    batch: _Batch,
) -> IngestResult:
    """Adds ``item``, retiring (superseding) ``retire``; a non-episode joins the peers of later drafts."""
    batch.new_items[item.id] = item
    retired_ids: list[str] = []
    for old in retire:
        old.superseded_by = item.id
        old.valid_until_ms = now
        old.updated_at_ms = now
        retired_ids.append(old.id)
        batch.touch(old)
        keep = [i for i, e in enumerate(peers.items) if e.id != old.id]
        peers.items = [peers.items[i] for i in keep]
        peers.matrix = peers.matrix[keep]
        peers.slots = [peers.slots[i] for i in keep]
    if kind is not MemoryKind.EPISODIC and not item.superseded_by:
        peers.items.append(item)
        peers.matrix = np.vstack([peers.matrix, vector[None, :]])
        peers.slots.append(slot)
    outcome = IngestOutcome.SUPERSEDED if retired_ids else IngestOutcome.CREATED
    return IngestResult(item, outcome, retired_ids)


def _decide(
    draft: MemoryDraft,
    kind: MemoryKind,
    content: str,
    vector: npt.NDArray[np.float32],
    *,
    peers: list[int],
    existing: list[MemoryItem],
    matrix: npt.NDArray[np.float32],
    slots: list[str],
    thresholds: Thresholds,
    slot: str,
    subject: str,
) -> Decision:
    """``decide`` over the ``peers`` (indexes into ``existing``, its vector ``matrix`` and ``slots``)."""
    return decide(
        kind,
        slot,
        vector,
        content=content,
        existing=[existing[i] for i in peers],
        existing_vectors=matrix[peers],
        existing_slots=[slots[i] for i in peers],
        thresholds=thresholds,
        subject=subject,
    )


# Metadata an item carries about where it came from and what it links to.
SUBJECT_KEY = "subject"  # whose fact it is: a participant's name; absent: the user
SESSIONS_KEY = "source_sessions"  # every session a merged item came from, oldest first
LINKS_KEY = "episodes"  # a durable item: the episodes of the turns that stated it
_MAX_LINKS = 16


def subject_of(metadata: dict[str, str]) -> str:
    return metadata.get(SUBJECT_KEY, "").strip().lower()


def _note_stated(stated: dict[str, list[MemoryItem]], draft: MemoryDraft, item: MemoryItem) -> None:
    for mid in draft.source_message_ids:
        stated.setdefault(mid, []).append(item)


def _link_episode(episode: MemoryItem, stated: dict[str, list[MemoryItem]], batch: _Batch) -> None:
    """Records the episode on the durable items its turn stated: retiring one of them finds it."""
    facts = stated.get(episode.source_message_ids[0], []) if episode.source_message_ids else []
    for item in facts:
        links = _linked_episodes(item)
        if episode.id not in links:
            item.metadata = {**item.metadata, LINKS_KEY: ",".join([*links, episode.id][-_MAX_LINKS:])}
            batch.touch(item)
    # A fact stated and retired within this very batch (by a later draft): the episode is stale already.
    retired = next((item for item in facts if item.superseded_by), None)
    if retired is not None:
        episode.metadata = {**episode.metadata, STALE_KEY: retired.id}


def _linked_episodes(item: MemoryItem) -> list[str]:
    return [e for e in item.metadata.get(LINKS_KEY, "").split(",") if e]


def embedding_text(content: str, keywords: Sequence[str]) -> str:
    """What an item's vector is computed from: its content, then its keywords. Keywords are keys the
    content implies but may not say (an episode's neighbouring turns, a date); the vector model sees
    them as the full-text index does."""
    keys = " ".join(clean_keywords(keywords))
    return f"{content}\n{keys}" if keys else content


def fold_provenance(
    target: MemoryItem, sessions: Sequence[str], message_ids: Sequence[str], max_ids: int
) -> None:
    """What ``target`` came from grows by ``sessions`` and ``message_ids`` (oldest first, each once, the
    newest ``max_ids`` kept): every session beyond its own is listed under ``SESSIONS_KEY``."""
    known = [s for s in target.metadata.get(SESSIONS_KEY, "").split(",") if s]
    for sid in (target.source_session_id, *sessions):
        if sid and sid not in known:
            known.append(sid)
    if len(known) > 1:
        target.metadata = {**target.metadata, SESSIONS_KEY: ",".join(known[-max_ids:])}
    target.source_message_ids = list(dict.fromkeys([*target.source_message_ids, *message_ids]))[-max_ids:]


def clamp(value: float) -> float:
    return min(1.0, max(0.0, float(value)))


def clean_keywords(words: Sequence[str]) -> list[str]:
    out = list(dict.fromkeys(w.strip() for w in words if w and w.strip()))
    return out[:32]
