"""``HotIndex``: the vectors of hot readers' memories in memory, so recall does not scan LanceDB; and
each entry's full-text twin, ``KeywordIndex`` (its section below), so neither retriever does.

A vector search in LanceDB prefilters the user's rows and compares every one of them (no ANN index
below ``ltm_vector_index_min_rows``): about 25 ms for a user holding 10,000 items, most of an
assembly. Here an entry holds, per *visibility* (user, agent, groups: exactly the rows
``filters.visible_to`` lets that reader see, loaded with that very predicate, never re-derived), the
not-superseded rows' ids, unit vectors and the few columns recall filters on. A search masks them with
``filters.narrowed_mask`` and takes the top by dot product. The rows' other columns are held too, so
hits are built without another read; their usage counts may lag by up to ``TTL_S`` (LanceDB's own lag
up to ``ltm_usage_flush_seconds``), which only nudges ranking.

Freshness: every write through ``MemoryService`` drops the user's entries (``forget``), as does erasure
and a change of the user's LTM version that removed rows. A change that only added or changed rows (a
worker's learn job, another sidecar's write) is caught up instead (``catch_up``): the rows the user's
changed since the entry was loaded (less ``CATCH_UP_MARGIN_MS``, for clocks and writes in flight) leave
the entry, and those of them the entry's reader may still see come back, read with the same predicate as
a load (a worker's learning is caught up behind the reads, a caller's write before the next one:
``ltm/core.py Freshness``). A load that a ``forget`` or a catch-up overtook is not kept. Entries also
expire after ``TTL_S``: the bound on staleness for readers that never read the version (SearchMemories
on a sidecar that did not write).

Bounded: entries are evicted least recently used past ``max_bytes``; a visibility too big for the
budget is served by LanceDB (and remembered as such for a while, so it is not loaded on every call).

``KeywordIndex``: BM25 over one hot entry's rows, in memory, so a recall asks LanceDB nothing.

LanceDB's full-text search took 17-25 ms of a 22-29 ms recall on LoCoMo (one user's 700 items, a
table of 2,800): most of a question's latency, while the vector side over the hot entry (ltm/hot.py)
took 2 ms. A reader's rows are few (at most a few thousand: the caps in ``MemoryTuning``), so postings
of their own words, held beside the entry's vectors, answer in well under a millisecond.

What is indexed is what LanceDB indexes (``schema.search_text``: content, then keywords), analysed the
same way in spirit: lower case, accents folded, stop words out, words reduced to a stem
(``stem``: suffixes of plural, tense and manner, so "camped", "camping" and "camps" meet). Document
frequencies are the reader's own rows', not the whole table's: a word common in one user's memories is
common for that user, whatever other tenants say.

Built on first use, once per entry (``HotEntry.keyword_index``), in a thread: tokenizing 5,000 rows is
tens of milliseconds that the event loop should not wait for.
"""

from __future__ import annotations

import asyncio
import math
import time
import unicodedata
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from .. import linear_regex
from . import filters
from .model import MemoryFilter, MemoryItem, Visibility
from .schema import META_COLUMNS, from_row
from .store import Hit, LanceMemoryStore
from .words import STOP_WORDS, SpeakerIndex, speaker_column

TTL_S = 60.0
# A catch-up reads rows changed this long before the entry was loaded too: a write in flight during the
# load (its updated_at_ms set before it committed) and another host's clock running behind stay covered.
CATCH_UP_MARGIN_MS = 60_000
_COLUMNS = list(dict.fromkeys([*META_COLUMNS, "vector", *filters.MASK_COLUMNS]))


@dataclass(slots=True)
class HotEntry:
    meta: pa.Table  # META_COLUMNS of the rows, to build the hits from
    vectors: npt.NDArray[np.float32]  # unit rows: a dot product is the cosine similarity
    columns: dict[str, npt.NDArray[Any]]
    expires: float
    nbytes: int = 0
    loaded_ms: int = 0  # wall clock when the rows were read (catch_up reads what changed since)
    # Who said each row (null unless a spoken turn), read on first need: only a query that names a
    # speaker uses it (ltm/recall.py).
    _speakers: pa.Array | None = None
    _speaker_index: SpeakerIndex | None = None
    # BM25 over the rows' content and keywords, built on first need (ltm/hot.py).
    _keywords: KeywordIndex | None = None

    def __len__(self) -> int:
        return int(self.meta.num_rows)

    async def speaker_index(self) -> SpeakerIndex:
        """Everyone who speaks in the rows, indexed by name. Read once per entry, in a thread: Arrow's
        regex releases the GIL, and 10,000 rows take a few ms that the event loop should not wait for."""
        if self._speakers is None or self._speaker_index is None:
            column, index = await asyncio.to_thread(_speakers_of, self.meta)
            self._speakers, self._speaker_index = column, index
        return self._speaker_index

    async def keyword_index(self) -> KeywordIndex:
        """The rows' full-text index. Built once per entry, in a thread (see ltm/hot.py)."""
        if self._keywords is None:
            self._keywords = await asyncio.to_thread(_keyword_index_of, self.meta)
        return self._keywords

    async def keyword_top(self, mask: npt.NDArray[np.bool_], query: str, n: int) -> list[Hit]:
        """The ``n`` rows under ``mask`` that best match ``query``'s words (BM25), best first."""
        best, scores = (await self.keyword_index()).top(query, mask, n)
        rows = self.meta.take(pa.array(best)).to_pylist()
        return [Hit(from_row(r), float(s)) for r, s in zip(rows, scores, strict=True)]

    def spoken_by(self, names: Sequence[str]) -> npt.NDArray[np.bool_]:
        """Which rows are spoken turns of one of ``names`` (after ``speaker_index``; else none)."""
        if self._speakers is None:
            return np.zeros(len(self), dtype=np.bool_)
        found = pc.is_in(self._speakers, value_set=pa.array(list(names), pa.string()))
        return np.asarray(found.fill_null(False).to_numpy(zero_copy_only=False), dtype=np.bool_)

    def items(self, mask: npt.NDArray[np.bool_]) -> list[MemoryItem]:
        """The rows under ``mask``, in table order."""
        return [from_row(r) for r in self.meta.filter(pa.array(mask)).to_pylist()]

    def top(self, mask: npt.NDArray[np.bool_], query: npt.NDArray[np.float32], n: int) -> list[Hit]:
        """The ``n`` rows under ``mask`` most similar to ``query``, best first, scored by cosine."""
        count = int(mask.sum())
        if not count or n <= 0:
            return []
        q = query.astype(np.float32)
        q = q / max(float(np.linalg.norm(q)), 1e-12)
        # All rows at once, then the mask: cheaper than gathering the rows. einsum, not ``@``: a matrix
        # product goes to OpenBLAS, whose worker threads spin against ONNX Runtime and LanceDB for
        # the same two cores (28 ms instead of 0.6 ms for 10,000 rows on a loaded machine).
        sims = np.einsum("ij,j->i", self.vectors, q)
        sims[~mask] = -np.inf
        n = min(n, count)
        best = np.argpartition(-sims, n - 1)[:n] if n < len(sims) else np.arange(len(sims))
        best = best[np.argsort(-sims[best], kind="stable")]
        rows = self.meta.take(pa.array(best)).to_pylist()
        return [Hit(from_row(r), float(sims[i])) for r, i in zip(rows, best, strict=True)]


@dataclass(slots=True)
class _Load:
    task: asyncio.Future[HotEntry | None]
    stale: bool = False


@dataclass(slots=True)
class HotStats:
    hits: int = 0
    misses: int = 0
    too_big: int = 0
    bytes: int = 0
    entries: int = 0
    catch_ups: int = 0  # entries brought up to date instead of loaded again


@dataclass(slots=True)
class HotIndex:
    store: LanceMemoryStore
    max_bytes: int
    ttl_s: float = TTL_S
    stats: HotStats = field(default_factory=HotStats)
    _entries: OrderedDict[tuple[str, str, tuple[str, ...]], HotEntry] = field(default_factory=OrderedDict)
    _too_big: dict[tuple[str, str, tuple[str, ...]], float] = field(default_factory=dict)
    _loads: dict[tuple[str, str, tuple[str, ...]], _Load] = field(default_factory=dict)

    @staticmethod
    def _key(who: Visibility) -> tuple[str, str, tuple[str, ...]]:
        # Two callers with these equal see the same rows under ``visible_to`` (empty groups ignored);
        # the whole user's view is keyed apart from any agent's (an agent id never holds a NUL).
        if who.every_agent:
            return who.user_id, "\0every-agent", ()
        return who.user_id, who.agent_id, tuple(sorted({g for g in who.groups if g}))

    async def view(self, who: Visibility) -> HotEntry | None:
        """The entry for ``who``; None when it is not held (disabled, or too big: use LanceDB)."""
        if self.max_bytes <= 0:
            return None
        key = self._key(who)
        now = time.monotonic()
        entry = self._entries.get(key)
        if entry is not None and entry.expires > now:
            self._entries.move_to_end(key)
            self.stats.hits += 1
            return entry
        if self._too_big.get(key, 0.0) > now:
            return None
        self.stats.misses += 1
        load = self._loads.get(key)
        if load is None:
            load = self._loads[key] = _Load(asyncio.ensure_future(self._load(who)))
            load.task.add_done_callback(lambda _f: self._settle(key, load))
        return await asyncio.shield(load.task)

    async def _load(self, who: Visibility) -> HotEntry | None:
        loaded_ms = _wall_ms()
        where = filters.visible_to(who) & filters.not_superseded()
        table = await self.store.fetch_columns(where, _COLUMNS)
        entry = _entry(table, time.monotonic() + self.ttl_s)
        entry.loaded_ms = loaded_ms
        return entry

    async def catch_up(self, user_id: str) -> None:
        """Bring the user's entries up to date with rows added or changed elsewhere (no row removed: the
        caller knows, ``ltm/core.py``). An entry that fails to catch up is dropped (the next view
        loads it)."""
        for key, load in list(self._loads.items()):
            if key[0] == user_id:  # it may have read the table before the change
                load.stale = True
                del self._loads[key]
        for key, entry in [(k, e) for k, e in self._entries.items() if k[0] == user_id]:
            who = Visibility(user_id=key[0], agent_id=key[1], groups=list(key[2]))
            since = filters.updated_since(entry.loaded_ms - CATCH_UP_MARGIN_MS)
            loaded_ms = _wall_ms()
            try:
                changed = await self.store.fetch_columns(filters.owned_by(user_id) & since, ["id"])
                fresh = await self.store.fetch_columns(
                    filters.visible_to(who) & filters.not_superseded() & since, _COLUMNS
                )
            except Exception:  # a failing read must not serve a stale entry
                self._drop(key)
                raise
            if self._entries.get(key) is not entry:
                continue  # forgotten or replaced meanwhile
            merged = _merged(entry, changed, fresh)
            merged.loaded_ms = loaded_ms
            self._entries[key] = merged
            self.stats.bytes += merged.nbytes - entry.nbytes
            self.stats.catch_ups += 1

    def _drop(self, key: tuple[str, str, tuple[str, ...]]) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.stats.bytes -= old.nbytes
            self.stats.entries = len(self._entries)

    def _settle(self, key: tuple[str, str, tuple[str, ...]], load: _Load) -> None:
        if self._loads.get(key) is load:
            del self._loads[key]
        if load.stale or load.task.cancelled() or load.task.exception() is not None:
            return
        entry = load.task.result()
        if entry is None:
            return
        if entry.nbytes > self.max_bytes:
            self._too_big[key] = entry.expires
            self.stats.too_big += 1
            return
        old = self._entries.pop(key, None)
        self.stats.bytes += entry.nbytes - (old.nbytes if old else 0)
        self._entries[key] = entry
        while self.stats.bytes > self.max_bytes and self._entries:
            _, evicted = self._entries.popitem(last=False)
            self.stats.bytes -= evicted.nbytes
        self.stats.entries = len(self._entries)

    def forget(self, user_id: str) -> None:
        """Drop every entry of the user (a write, a version change, erasure), and keep no load in flight."""
        for key in [k for k in self._entries if k[0] == user_id]:
            self.stats.bytes -= self._entries.pop(key).nbytes
        for key in [k for k in self._too_big if k[0] == user_id]:
            del self._too_big[key]
        for key, load in list(self._loads.items()):
            if key[0] == user_id:
                load.stale = True
                del self._loads[key]
        self.stats.entries = len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self._too_big.clear()
        for load in self._loads.values():
            load.stale = True
        self._loads.clear()
        self.stats.bytes = self.stats.entries = 0

    def holds(self, user_id: str) -> bool:
        """Whether anything keyed by the user is held (erasure tests)."""
        return any(k[0] == user_id for k in [*self._entries, *self._too_big, *self._loads])


def _wall_ms() -> int:
    return int(time.time() * 1000)


def _merged(entry: HotEntry, changed: pa.Table, fresh: pa.Table) -> HotEntry:
    """``entry`` without the rows ``changed`` names, with the rows of ``fresh`` (read like a load)."""
    ids = entry.meta["id"].to_numpy(zero_copy_only=False)
    keep = ~np.isin(ids, changed["id"].to_numpy(zero_copy_only=False))
    new = _entry(fresh, entry.expires)
    if not len(new):
        vectors = entry.vectors[keep]
    elif not len(entry) or not keep.any():
        vectors = new.vectors
    else:
        vectors = np.concatenate([entry.vectors[keep], new.vectors])
    meta = pa.concat_tables([entry.meta.filter(pa.array(keep)), new.meta.cast(entry.meta.schema)])
    columns = {name: np.concatenate([entry.columns[name][keep], new.columns[name]]) for name in entry.columns}
    return HotEntry(meta, vectors, columns, entry.expires, _held_bytes(meta, vectors, columns))


def _entry(table: pa.Table, expires: float) -> HotEntry:
    n = table.num_rows
    vectors = np.zeros((0, 0), np.float32)
    if n:
        flat = table["vector"].combine_chunks().flatten().to_numpy(zero_copy_only=False)
        vectors = np.asarray(flat, dtype=np.float32).reshape(n, -1)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        vectors = vectors / np.clip(norms, 1e-12, None)
    columns: dict[str, npt.NDArray[Any]] = {}
    for name in filters.MASK_COLUMNS:
        column = table[name]
        if pa.types.is_integer(column.type):
            # A null compares false in SQL: as -1 it matches neither "== 0" nor "> now" (validity).
            column = column.fill_null(-1)
        columns[name] = column.to_numpy(zero_copy_only=False)
    meta = table.select(META_COLUMNS)
    return HotEntry(meta, vectors, columns, expires, _held_bytes(meta, vectors, columns))


def _held_bytes(meta: pa.Table, vectors: npt.NDArray[Any], columns: dict[str, npt.NDArray[Any]]) -> int:
    """What an entry holds, about: its buffers, plus a string object (about 64 bytes beyond its pointer)
    a row for every object column of the mask (kind, scope, the channel's and the session's digests)."""
    strings = sum(1 for c in columns.values() if c.dtype == object) * 64 * meta.num_rows
    held: int = vectors.nbytes + meta.nbytes + sum(c.nbytes for c in columns.values()) + strings
    return held


def mask_for(entry: HotEntry, flt: MemoryFilter, now_ms: int) -> npt.NDArray[np.bool_]:
    return filters.narrowed_mask(entry.columns, flt, now_ms)


def _keyword_index_of(meta: pa.Table) -> KeywordIndex:
    """What LanceDB's full-text index reads of each row (``schema.search_text``), indexed."""
    contents = meta.column("content").to_pylist()
    keywords = meta.column("keywords").to_pylist()
    return KeywordIndex([" ".join([c or "", *(k or [])]) for c, k in zip(contents, keywords, strict=True)])


def _speakers_of(meta: pa.Table) -> tuple[pa.Array, SpeakerIndex]:
    column = speaker_column(meta)
    return column, SpeakerIndex(column.unique().drop_null().to_pylist())


# --- ``KeywordIndex``: BM25 over one hot entry's rows, in memory, so a recall asks LanceDB nothing.

K1 = 1.2
B = 0.75
# A row whose score is under this share of the best row's matched a small part of what the best one
# matched ("SKU-3902-A" against the query "SKU-4411-B": the word "sku" alone). It is no keyword
# evidence: kept in the list, its rank would outvote the vector side in fusion. (Measured: 0.4 keeps
# the golden set's figures and LoCoMo's; 0.3 lets the look-alike SKU through, 0.5 costs LoCoMo 0.4 pt.)
MIN_SHARE_OF_BEST = 0.4
_WORD = linear_regex.compile_run(r"\w+")
# Longest first: "ies" before "es" before "s".
_SUFFIXES = ("ingly", "edly", "ings", "ing", "ies", "ied", "ed", "ly", "es", "s")
_KEEP_S = ("ss", "us", "is")  # "glass", "bus", "this": not plurals
MIN_STEM = 3


def stem(word: str) -> str:
    """A light English stemmer: the suffix of plural, tense or manner off, a doubled final consonant and
    a final "e" off ("running"/"runs" -> "run", "hiking"/"hikes"/"hike" -> "hik"); short words kept."""
    if not word.isalpha():
        return word  # an id or a number ("4411", "sku4411") is matched as written
    w = word
    for suffix in _SUFFIXES:
        if w.endswith(suffix) and len(w) - len(suffix) >= MIN_STEM:
            if suffix == "s" and w.endswith(_KEEP_S):
                break
            w = w[: -len(suffix)] + ("y" if suffix in ("ies", "ied") else "")
            break
    if len(w) > MIN_STEM and w[-1] == w[-2] and w[-1] not in "aeiouslz":
        w = w[:-1]
    if len(w) > MIN_STEM and w.endswith("e"):
        w = w[:-1]
    return w


# Letters that no Unicode decomposition takes apart, folded as ASCII folding does.
_LETTERS = str.maketrans(
    {"ø": "o", "æ": "ae", "œ": "oe", "ß": "ss", "đ": "d", "ł": "l", "þ": "th", "\u0131": "i"}  # dotless i
)


def fold(text: str) -> str:
    """Lower case without accents ("Zoë" -> "zoe", "Tromsø" -> "tromso")."""
    decomposed = unicodedata.normalize("NFKD", text.lower().translate(_LETTERS))
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def terms(text: str) -> list[str]:
    """The stems of ``text``'s words that are not stop words, in order (repeats kept: term frequency)."""
    return [stem(w) for w in _WORD.findall(fold(text)) if w not in STOP_WORDS]


class KeywordIndex:
    """Postings (row numbers and term counts per stem) of a fixed list of texts, scored by Okapi BM25."""

    def __init__(self, texts: Sequence[str]) -> None:
        self._n = len(texts)
        rows: dict[str, list[int]] = {}
        counts: dict[str, list[int]] = {}
        lengths = np.zeros(self._n, np.float32)
        for i, text in enumerate(texts):
            bag = Counter(terms(text))
            lengths[i] = sum(bag.values())
            for term, tf in bag.items():
                rows.setdefault(term, []).append(i)
                counts.setdefault(term, []).append(tf)
        self._rows = {t: np.asarray(r, np.int64) for t, r in rows.items()}
        self._tf = {t: np.asarray(c, np.float32) for t, c in counts.items()}
        avg = float(lengths.mean()) if self._n else 0.0
        # The length part of BM25's denominator, per row: K1 * (1 - B + B * length / average).
        self._norm = K1 * (1.0 - B + B * lengths / avg) if avg else np.full(self._n, K1, np.float32)

    def __len__(self) -> int:
        return self._n

    def idf(self, term: str) -> float:
        df = len(self._rows.get(term, ()))
        return math.log(1.0 + (self._n - df + 0.5) / (df + 0.5))

    def scores(self, query: str) -> npt.NDArray[np.float32]:
        """BM25 of every row for ``query``'s terms (each counted once); 0 where none matches."""
        out = np.zeros(self._n, np.float32)
        for term in dict.fromkeys(terms(query)):
            rows = self._rows.get(term)
            if rows is None:
                continue
            tf = self._tf[term]
            out[rows] += self.idf(term) * tf * (K1 + 1.0) / (tf + self._norm[rows])
        return out

    def top(
        self, query: str, mask: npt.NDArray[np.bool_], n: int
    ) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float32]]:
        """Row numbers of the ``n`` best rows under ``mask`` that match well enough (``MIN_SHARE_OF_BEST``),
        best first, and their scores. Ties go to the lower row number (deterministic); fusion gives tied
        rows one rank (recall.py)."""
        scores = self.scores(query)
        scores[~mask] = 0.0
        hits = np.flatnonzero(scores > 0.0)
        if not len(hits) or n <= 0:
            return np.zeros(0, np.intp), np.zeros(0, np.float32)
        hits = hits[scores[hits] >= MIN_SHARE_OF_BEST * float(scores[hits].max())]
        order = np.lexsort((hits, -scores[hits]))[:n]
        best = hits[order]
        return best, scores[best]
