"""``MemoryCore``: the state and the few helpers every part of ``MemoryService`` shares (the store,
embedder, policy, locks and the in-memory recall index; change notification; content checks)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from ..embedding import Embedder
from ..errors import InvalidArgument
from .freshness import Freshness, Versions
from .history import Change, HistoryLog
from .hot import HotIndex
from .slots import SlotReader
from .store import LanceMemoryStore
from .tuning import MemoryTuning
from .usage import UsageRecorder

MAX_CONTENT_CHARS = 4000
LOCK_STRIPES = 64
DELETE_BATCH = 1000

# Returns the kinds of personal data found in a text (empty when clean). Injected by app.py so the
# storage boundary enforces the PII rule whoever wrote the item, without ltm importing extraction.
ContentGuard = Callable[[str], list[str]]


def _now_ms() -> int:
    return int(time.time() * 1000)


class MemoryCore:
    def __init__(
        self,
        store: LanceMemoryStore,
        embedder: Embedder,
        policy: MemoryTuning,
        *,
        guard: ContentGuard | None = None,
        clock: Callable[[], int] = _now_ms,
        usage_flush_interval_s: float = 1.0,
        on_change: Callable[[str, bool], Awaitable[None]] | None = None,
        hot_index_mb: int,  # from the settings (wiring/), which hold the default
        history: HistoryLog | None = None,
        versions: Versions | None = None,
    ) -> None:
        self._store = store
        self._embedder = embedder
        self._policy = policy
        self._guard = guard
        self._clock = clock
        self._usage = UsageRecorder(store, flush_interval_s=usage_flush_interval_s)
        # Called with a user id after each write that changes what the user's reads return (not usage
        # counts), once the write is visible, and whether it removed rows: caches invalidate on it.
        self._on_change = on_change
        # Striped locks serialize ingest per (user, agent), so two concurrent promotions cannot both
        # decide "insert" for the same fact; unrelated users rarely share a stripe.
        self._locks = [asyncio.Lock() for _ in range(LOCK_STRIPES)]
        self._hot = HotIndex(store, max_bytes=hot_index_mb << 20)
        # Reads see what other processes wrote (a worker's promotions): ltm/freshness.py.
        self.freshness = Freshness(
            versions, refresh=store.refresh, drop=self._hot.forget, catch_up=self._hot.catch_up
        )
        # Slots recognised by meaning, for items that name none (ltm/slots.py).
        self._slots = SlotReader(embedder, min_similarity=self._policy.slot_similarity)
        # Every change to an item is journaled there as a version (who, when, why): see ltm/history.py.
        self._history = history

    @property
    def store(self) -> LanceMemoryStore:
        return self._store

    @property
    def policy(self) -> MemoryTuning:
        return self._policy

    @property
    def hot_index(self) -> HotIndex:
        return self._hot

    @property
    def embedder(self) -> Embedder:
        return self._embedder

    @property
    def history(self) -> HistoryLog | None:
        return self._history

    def now_ms(self) -> int:
        return self._clock()

    async def changed(self, user_id: str) -> None:
        """Announce a write made outside this class (a snapshot restore, which removes rows) to the
        caches."""
        await self._changed(user_id, removed=True)

    async def _journal(self, user_id: str, actor: str, changes: list[Change]) -> None:
        if self._history is not None and changes:
            await self._history.record(user_id, actor, changes)

    def drop_cached(self, user_id: str) -> None:
        """Forget what is held in memory about the user (their data changed, maybe elsewhere)."""
        self._hot.forget(user_id)
        self.freshness.forget(user_id)

    async def _changed(self, *user_ids: str, removed: bool = False) -> None:
        """``removed``: the write deleted rows (other processes must reload, not catch up)."""
        for user_id in user_ids:
            self._hot.forget(user_id)
        if self._on_change is not None:
            for user_id in user_ids:
                await self._on_change(user_id, removed)

    def check_content(self, content: str) -> str:
        """The rules every stored text meets (present, bounded, no personal data), for writers beside
        the service (ltm/merging.py); returns the text stripped."""
        return self._check_content(content)

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
