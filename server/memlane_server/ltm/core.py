"""``MemoryCore``: the state and the few helpers every part of ``MemoryService`` shares (the store,
embedder, policy, locks and the in-memory recall index; change notification; content checks), and the
three collaborators it composes, each in its section below: freshness (``Freshness``), batched usage
(``UsageRecorder``) and slots (``SlotReader``, ``canonical_slot``).

A reader's view kept current with writes made elsewhere: by a worker process of this sidecar (session
end, learning), or by another sidecar on the same table.

Every LTM write bumps the user's version token in Redis (``ltm/redis_state.py``), and a write that
removed rows its removals token too. Before a read of a user's memories, both are read (once per user in
flight: a profile and a recall of one assembly share them) and compared with the ones this process's
view was last current with. On a change the table's view is refreshed, and the user's in-memory recall
entry is brought up to date with the rows changed since it was loaded (``catch_up``: a learn job's new
episodes cost their own rows, not a reload of the user's ten thousand), or dropped when rows were
removed (a reload is then the only way to see what is gone). Either way the read sees the write. A
token seen is trusted for an hour at most (a lost bump cannot keep a view stale for longer).

Writes learning makes (an open session's promotions: learn and facts jobs) bump a learnt token instead,
unless they removed rows (a session end's stay as they were: PromoteSession's caller waits to read
them). Nobody waits to read learning's rows, and while a user's sessions are being learnt from they come
every few hundred milliseconds: catching up before each read made every context call pay a table read.
So a read that finds only the learnt token changed goes on with the view as it is and starts one
catch-up behind it (per user at a time); the next read after it sees the rows (tens of milliseconds).

Batched usage bumps: assembly reports which items it injected, the table is written once a second.

Recording is a dict update on the event loop (no I/O on the hot path). The flusher groups ids by
their increment so a burst of bumps costs a handful of table versions, not one per item.

Single-valued attributes: one name per attribute, and the slot of an item that names none.

**One name per attribute.** Callers name slots freely (``home_city`` through ``remember``, ``location``
from the rule extractor, ``lives_in`` from an LLM's output), and newest-wins only works when two items
stating one attribute meet under one slot. ``canonical_slot`` folds every name of a family to the
family's name (the rule extractor's); it runs at every write (ingest, update) and on stored items when
they are compared, so items written before a name joined a family meet too.

**By wording.** A statement of the common attributes in the usual third-person shapes ("Lives in
Munich.", "User works at Acme.") names its slot by its first words (``slot_by_wording``), whoever
wrote it.

**By meaning.**
An extractor sets a slot where its pattern knows the attribute ("I live in ..." is ``location``); an
explicit memory, an LLM's output or a wording no pattern knows comes without one, and then a changed
preference could never retire the old one. Each attribute here is described once, in words; an item
whose vector is close enough to a description states that attribute, whatever its phrasing ("User
prefers answers in imperial units.", "Use the metric system."). No list of change phrases ("now",
"switched to") is involved: the newer of two items stating one attribute wins, whatever it says.

Only attributes whose description stands apart from everyday statements under the embedding model are
listed (measured with MiniLM on hand-written items, not on any benchmark: a unit preference scores
0.59-0.75 against its description, unrelated preferences and facts 0.08-0.46). Places, employers and
jobs are not: their items are dominated by the names in them, so cosine cannot tell "lives in" from
"works at" (0.74 against 0.79 with the names masked); those keep the extractor's slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from .. import linear_regex
from ..embedding import Embedder
from ..errors import InvalidArgument
from . import filters
from .history import Change, HistoryLog
from .hot import HotIndex
from .store import LanceMemoryStore
from .tuning import MemoryTuning

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
        on_change: Callable[[str, bool, bool], Awaitable[None]] | None = None,
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
        # Striped locks serialize ingest per user (every agent's: a user-wide attribute has one answer
        # across agents, ltm/conflicts.py), so two concurrent promotions cannot both decide "insert" for
        # the same fact, nor two values of one attribute both stay; unrelated users rarely share a stripe.
        # Per process: a worker process's ingest and the serving process's are not serialized.
        self._locks = [asyncio.Lock() for _ in range(LOCK_STRIPES)]
        self._hot = HotIndex(store, max_bytes=hot_index_mb << 20)
        # Reads see what other processes wrote (a worker's promotions): ltm/core.py.
        self.freshness = Freshness(
            versions, refresh=store.refresh, drop=self._hot.forget, catch_up=self._hot.catch_up
        )
        # Slots recognised by meaning, for items that name none (ltm/core.py).
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

    async def _changed(self, *user_ids: str, removed: bool = False, learnt: bool = False) -> None:
        """``removed``: the write deleted rows (other processes must reload, not catch up); ``learnt``:
        learning made it (other processes' reads need not wait for it)."""
        for user_id in user_ids:
            self._hot.forget(user_id)
        if self._on_change is not None:
            for user_id in user_ids:
                await self._on_change(user_id, removed, learnt)

    def check_content(self, content: str) -> str:
        """The rules every stored text meets (present, bounded, no personal data), for writers beside
        the service (ltm/operations.py); returns the text stripped."""
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


# --- A reader's view kept current with writes made elsewhere: by a worker process of this sidecar (session

SEEN_TTL_S = 3600.0
_SEEN_SIZE = 4096


class Versions(Protocol):
    async def read(self, user_id: str) -> tuple[bytes, bytes, bytes]: ...


@dataclass(slots=True)
class FreshnessStats:
    inline_catch_ups: int = 0  # a read waited for the rows a write elsewhere changed
    background_catch_ups: int = 0  # learning's rows taken in behind the reads (none waited)


@dataclass(frozen=True, slots=True)
class _Seen:
    version: bytes
    removals: bytes
    learnt: bytes
    until: float  # when the tokens stop being trusted


class Freshness:
    """A reader's view kept current with writes made elsewhere (module docstring), in three cases by the
    tokens that changed: removals (reload), a write a caller made (caught up before the read), learning
    alone (caught up behind the reads, ``_learnt``)."""

    def __init__(
        self,
        versions: Versions | None,
        *,
        refresh: Callable[[], Awaitable[None]],
        drop: Callable[[str], None],
        catch_up: Callable[[str], Awaitable[None]],
    ) -> None:
        """``refresh``: bring the table's view to its latest version; ``drop``: forget what this process
        holds of one user (the in-memory recall entry); ``catch_up``: bring it up to date with the rows
        changed since it was loaded."""
        self._versions = versions
        self._refresh = refresh
        self._drop = drop
        self._catch_up = catch_up
        self._seen: OrderedDict[str, _Seen] = OrderedDict()
        self._reads: dict[str, asyncio.Future[tuple[bytes, bytes, bytes]]] = {}
        self._learning: dict[str, asyncio.Task[None]] = {}
        self.stats = FreshnessStats()

    async def current(self, user_id: str) -> bytes:
        """The token of the user's memory this process's view is current with ("" without tokens)."""
        if self._versions is None:
            return b""
        read = self._reads.get(user_id)
        if read is None:
            read = self._reads[user_id] = asyncio.ensure_future(self._versions.read(user_id))
            read.add_done_callback(lambda _f: self._reads.pop(user_id, None))
        version, removals, learnt = await asyncio.shield(read)
        seen = self._seen.get(user_id)
        now = time.monotonic()
        if seen is None or seen.version != version or seen.removals != removals or seen.until <= now:
            await self._refresh()
            if seen is not None and seen.removals == removals and seen.until > now:
                self.stats.inline_catch_ups += 1
                await self._catch_up(user_id)  # rows added or changed only
            else:
                self._drop(user_id)
            seen = self._remember(user_id, _Seen(version, removals, learnt, now + SEEN_TTL_S))
        elif seen.learnt != learnt and user_id not in self._learning:
            # Only learning wrote (a worker's promotion, a facts job): no caller waits for those rows,
            # so the read goes on with the view as it is, and the rows come in behind it.
            task = asyncio.create_task(self._learnt(user_id, seen, learnt), name="memlane-ltm-catch-up")
            self._learning[user_id] = task
            task.add_done_callback(lambda _t: self._learning.pop(user_id, None))
        return seen.version + seen.learnt

    async def _learnt(self, user_id: str, seen: _Seen, learnt: bytes) -> None:
        try:
            await self._refresh()
            await self._catch_up(user_id)
        except Exception:  # the entry was dropped (hot.py): the next read loads it
            log.warning("catching up with learnt memories failed", exc_info=True)
            return
        self.stats.background_catch_ups += 1
        if self._seen.get(user_id) is seen:  # else a read or a forget moved the view meanwhile
            self._remember(user_id, _Seen(seen.version, seen.removals, learnt, seen.until))

    def _remember(self, user_id: str, seen: _Seen) -> _Seen:
        self._seen[user_id] = seen
        self._seen.move_to_end(user_id)
        while len(self._seen) > _SEEN_SIZE:
            self._seen.popitem(last=False)
        return seen

    def forget(self, user_id: str) -> None:
        """Erasure: the user id itself is the user's data."""
        self._seen.pop(user_id, None)


# --- Batched usage bumps: assembly reports which items it injected, the table is written once a second.

log = logging.getLogger(__name__)


class UsageRecorder:
    def __init__(
        self, store: LanceMemoryStore, *, flush_interval_s: float = 1.0, max_pending: int = 512
    ) -> None:
        self._store = store
        self._interval = flush_interval_s
        self._max_pending = max_pending
        self._pending: Counter[str] = Counter()
        self._task: asyncio.Task[None] | None = None
        self._kick = asyncio.Event()
        self._lock = asyncio.Lock()

    def record(self, ids: list[str]) -> None:
        """Count one use of each id; never blocks, never raises for unknown ids."""
        for memory_id in ids:
            if memory_id:
                self._pending[memory_id] += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="memlane-usage-flush")
        if len(self._pending) >= self._max_pending:
            self._kick.set()

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow stop()'s cancel
                async with asyncio.timeout(self._interval):
                    await self._kick.wait()
            self._kick.clear()
            try:
                await self.flush()
            except Exception:  # a failed flush must not kill the recorder; the counts are retried
                log.exception("usage flush failed")

    async def flush(self) -> None:
        """Write pending bumps now (also called at shutdown and by tests that need read-your-writes)."""
        async with self._lock:
            if not self._pending:
                return
            batch, self._pending = self._pending, Counter()
            now_ms = int(time.time() * 1000)
            by_increment: defaultdict[int, list[str]] = defaultdict(list)
            for memory_id, count in batch.items():
                by_increment[count].append(memory_id)
            groups = list(by_increment.items())
            for n, (increment, ids) in enumerate(groups):
                try:
                    # Both values are ints produced here, never caller text.
                    await self._store.update(
                        filters.with_ids(ids),
                        {"usage_count": f"usage_count + {int(increment)}", "last_used_at_ms": str(now_ms)},
                    )
                except Exception:
                    # Requeue only what was not written, so a retry does not count twice.
                    for inc, rest in groups[n:]:
                        for memory_id in rest:
                            self._pending[memory_id] += inc
                    raise

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush()


# --- Single-valued attributes: one name per attribute, and the slot of an item that names none.

# family -> the other names callers give it. The families are the rule extractor's slots.
FAMILIES: dict[str, tuple[str, ...]] = {
    "name": ("full_name", "user_name", "preferred_name"),
    "location": (
        "home_city", "city", "lives_in", "living_in", "address", "town", "home",
        "residence", "current_city", "current_location", "based_in", "home_location", "city_of_residence",
    ),
    "hometown": ("home_town", "birthplace", "place_of_birth", "born_in", "grew_up_in", "origin"),
    "employer": (
        "company", "works_at", "work_place", "workplace", "employer_name", "works_for", "organization",
    ),
    "job": ("occupation", "profession", "job_title", "role", "position", "works_as"),
    "diet": ("dietary_preference", "diet_type", "dietary_restriction"),
    "units": ("unit_system", "measurement_units", "unit_preference", "measurement_system"),
    "temperature_unit": ("temperature_units", "temperature_scale"),
    "timezone": ("time_zone", "tz"),
    "reply_language": ("preferred_language", "response_language", "answer_language"),
}  # fmt: skip
_FAMILY_OF = {alias: family for family, aliases in FAMILIES.items() for alias in (family, *aliases)}
_SEPARATORS = linear_regex.compile(r"[\s\-./]+")
MAX_SLOT_CHARS = 128


def canonical_slot(slot: str) -> str:
    """The family name of ``slot`` ("Home City", "home-city" and "home_city" are ``location``); a name
    no family holds is kept, folded the same way. A "favorite:<thing>" slot keeps its thing."""
    folded = _SEPARATORS.sub("_", slot.strip().lower()).strip("_")[:MAX_SLOT_CHARS]
    head, sep, rest = folded.partition(":")
    if sep:
        return f"{_FAMILY_OF.get(head, head)}:{rest.strip('_')}"
    return _FAMILY_OF.get(folded, folded)


# "(The) user('s) / I" then the attribute's verb: the shapes memories are written in.
_SUBJECT = r"^(?:the\s+)?(?:user(?:'s)?\s+|i\s+|i'm\s+|i\s+am\s+)?(?:is\s+)?(?:now\s+|currently\s+)?"
_WORDING: tuple[tuple[str, linear_regex.Pattern], ...] = tuple(
    (slot, linear_regex.compile(_SUBJECT + pattern, ignore_case=True))
    for slot, pattern in (
        ("location", r"(?:lives|live|living|resides|based|located)\s+in\s+\S"),
        ("hometown", r"(?:(?:is|am|i'm)\s+from|comes\s+from|grew\s+up\s+in|was\s+born\s+in)\s+\S"),
        ("employer", r"(?:works|work|working|employed)\s+(?:at|for|by)\s+\S"),
        ("job", r"(?:works|work|working|employed)\s+as\s+\S"),
        ("name", r"name\s+is\s+\S"),
    )
)


def stated_slot(given: str, content: str) -> str:
    """The slot an item is stored with: the one it was given, in its family's name, else the one its
    wording names ("" if neither: meaning alone is not stored, ``SlotReader`` re-reads it on comparison)."""
    return canonical_slot(given) or slot_by_wording(content)


def slot_by_wording(content: str) -> str:
    """The slot a statement names by its first words ("Lives in Munich." is ``location``), or ""."""
    head = content.strip()[:200]
    return next((slot for slot, pattern in _WORDING if pattern.search(head)), "")


# slot -> what it means (the slot names are those the rule extractor and the golden set use).
DESCRIPTIONS: dict[str, str] = {
    "units": "Prefers metric or imperial units of measurement.",
    "temperature_unit": "Prefers temperatures in Celsius or Fahrenheit.",
    "diet": "Follows a vegetarian, vegan or other diet.",
    "timezone": "The time zone the person is in.",
    "reply_language": "The language answers should be written in.",
}


class SlotReader:
    """The descriptions' vectors, embedded once per process on first use."""

    def __init__(self, embedder: Embedder, *, min_similarity: float) -> None:
        self._embedder = embedder
        self._min = min_similarity
        self._names = list(DESCRIPTIONS)
        self._matrix: npt.NDArray[np.float32] | None = None
        self._lock = asyncio.Lock()

    async def ready(self) -> None:
        if self._matrix is not None:
            return
        async with self._lock:
            if self._matrix is None:
                self._matrix = await self._embedder.embed([DESCRIPTIONS[n] for n in self._names])

    def slot_of(self, given: str, content: str, vector: npt.NDArray[np.float32]) -> str:
        """The slot an item is compared under: ``stated_slot``, else the one recognised by meaning."""
        return stated_slot(given, content) or self.infer(vector[None, :])[0]

    def slots_of(
        self, given: list[str], contents: list[str], vectors: npt.NDArray[np.float32], *, worded: bool = True
    ) -> list[str]:
        """``slot_of`` of many items (one matrix product for those that need meaning). ``worded`` False
        for stored items whose slot already holds what their wording named (every write since it is
        stored: ``stated_slot``), when the wording's patterns would cost more than the rest (5 us an
        item)."""
        out = [
            stated_slot(g, c) if worded else canonical_slot(g) for g, c in zip(given, contents, strict=True)
        ]
        bare = [i for i, s in enumerate(out) if not s]
        if bare:
            for i, slot in zip(bare, self.infer(vectors[bare]), strict=True):
                out[i] = slot
        return out

    def infer(self, vectors: npt.NDArray[np.float32]) -> list[str]:
        """Per row of ``vectors`` (unit vectors), the slot it states, or "" (call ``ready`` first)."""
        if self._matrix is None or not len(vectors):
            return [""] * len(vectors)
        sims = vectors @ self._matrix.T
        best = np.argmax(sims, axis=1)
        return [self._names[int(j)] if float(sims[i, j]) >= self._min else "" for i, j in enumerate(best)]
