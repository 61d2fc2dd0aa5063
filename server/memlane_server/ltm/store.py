"""``LanceMemoryStore``: the LanceDB table of memory items (async API, so no call blocks the loop).

Storage only: it knows columns, indexes and queries, not ranking or conflict policy. Every read takes
a filter expression that the caller built from ``filters.visible_to`` or ``filters.owned_by``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import lancedb
import numpy as np
import numpy.typing as npt
import pyarrow as pa
from lancedb.expr import Expr, col, lit
from lancedb.index import FTS, Bitmap, BTree, IvfHnswSq
from lancedb.query import ColumnOrdering

from .. import linear_regex
from ..errors import DataLoss, Unavailable
from ..infra.endpoints import lance_storage_options
from ..memory_kinds import MemoryKind, MemoryScope
from . import filters
from .filters import KEY_COLUMNS
from .model import MemoryItem, id_unavailable
from .schema import META_COLUMNS, TABLE_NAME, from_row, table_schema, to_row
from .sharing import (
    LANCE_ERRORS,
    Contention,
    LocalTableLock,
    TableLock,
    is_conflict,
    is_stale,
    retry_read,
    retry_write,
)
from .words import content_terms

log = logging.getLogger(__name__)
T = TypeVar("T")
# How long an erasure waits for another sidecar's compaction (43 s at 100k rows) before UNAVAILABLE;
# a sidecar starting on a fresh table waits as long for another creating its indexes.
_EXCLUSIVE_WAIT_S = 300.0
_SCALAR_INDEXES: list[tuple[str, Any]] = [
    ("user_key", Bitmap()),
    ("id_key", BTree()),
    # Stemming and stop words help prose; ascii folding lets "Zurich" find "Zürich".
    ("search_text", FTS(with_position=False, stem=True, remove_stop_words=True, ascii_folding=True)),
]

_NEWEST_FIRST = [
    ColumnOrdering(column_name="created_at_ms", ascending=False),
    ColumnOrdering(column_name="id_key", ascending=False),
]

# Ids per predicate when looking up who holds a batch's ids.
_ID_BATCH = 1000
# The row a merge may update is the one its user holds: the join is on the id (unique in the table),
# this condition keeps it to (user, id). Column names only, no caller text.
_SAME_USER = "target.user_key = source.user_key"

# What a string literal in a predicate may be (see ``filters``): a digest, an enum word, or empty.
_LITERAL = linear_regex.compile(r"'((?:[^']|'')*)'")
_SAFE_WORDS = frozenset([*(k.value for k in MemoryKind), *(s.value for s in MemoryScope), ""])
_DIGEST = linear_regex.compile(r"[0-9a-f]{64}")


def checked(where: Expr) -> Expr:
    """Refuse a predicate holding any string literal other than a digest or an enum word.

    The last line of defence for the rule in ``filters``: LanceDB may turn the expression into SQL
    text, so a caller string in it is an injection. This inspects that very text.
    """
    sql = where.to_sql()
    for literal in _LITERAL.findall(sql):
        if literal not in _SAFE_WORDS and not _DIGEST.fullmatch(literal):
            raise ValueError(f"predicate holds a literal that is not a digest: {sql[:200]!r}")
    return where


@dataclass(slots=True)
class Hit:
    item: MemoryItem
    score: float  # BM25 for keyword hits, cosine similarity for vector hits


class LanceMemoryStore:
    """Open with ``await LanceMemoryStore.open(uri, ndims)``; ``uri`` is a directory or ``s3://...`` (the
    endpoint and credentials from the AWS environment variables, see ``infra/endpoints.py``)."""

    def __init__(
        self,
        db: lancedb.AsyncConnection,
        table: lancedb.AsyncTable,
        ndims: int,
        lock: TableLock | None = None,
        location: str = TABLE_NAME,
    ) -> None:
        self._db = db
        self._table = table
        self._ndims = ndims
        self._writes_since_optimize = 0
        self._lock = lock or LocalTableLock()
        self.contention = Contention()
        self.location = location  # where the table lives, as an operator names it
        # Set when a call finds the table damaged: from then on every read and write is refused with it
        # (DATA_LOSS), none answered from what is still readable or cached, until an operator repairs
        # the table and restarts the sidecar.
        self.damaged: DataLoss | None = None

    @classmethod
    async def open(
        cls,
        uri: str,
        ndims: int,
        *,
        storage_options: dict[str, str] | None = None,
        cache_mb: int = 0,
        lock: TableLock | None = None,
        read_consistency_s: float = -1.0,
    ) -> LanceMemoryStore:
        """``cache_mb`` bounds LanceDB's index and metadata caches (0: LanceDB's defaults, sized for a
        server of its own, gigabytes; a sidecar wants tens of MB). ``lock`` serializes compaction,
        index builds and erasure across the sidecars sharing the table (see ``sharing``);
        ``read_consistency_s`` bounds how late reads see their writes (negative: only this handle's own
        writes and ``refresh`` move it on)."""
        session = (
            lancedb.Session(index_cache_size_bytes=cache_mb << 20, metadata_cache_size_bytes=cache_mb << 19)
            if cache_mb
            else None
        )
        if storage_options is None:
            storage_options = lance_storage_options(uri)
        try:
            db = await lancedb.connect_async(
                uri,
                storage_options=storage_options,
                session=session,
                read_consistency_interval=(
                    timedelta(seconds=read_consistency_s) if read_consistency_s >= 0 else None
                ),
            )
            names = (await db.list_tables()).tables
            if TABLE_NAME in names:
                table = await db.open_table(TABLE_NAME)
            else:
                table = await db.create_table(TABLE_NAME, schema=table_schema(ndims), exist_ok=True)
        except (OSError, RuntimeError, ValueError) as exc:
            raise Unavailable(f"cannot open memory store at {uri}: {exc}") from exc
        vector_type = (await table.schema()).field("vector").type
        if getattr(vector_type, "list_size", ndims) != ndims:
            raise ValueError(
                f"memory store {uri} holds {vector_type.list_size}-dimensional vectors but the embedder"
                f" makes {ndims}: re-embed the table or configure the model it was built with"
            )
        store = cls(db, table, ndims, lock, f"{uri.rstrip('/')}/{TABLE_NAME}.lance")
        if await store._setup_pending():
            # Only then the lock: a sidecar restarting after a kill -9 mid-compaction must not wait out
            # the dead holder's lease for nothing.
            async with store._lock.hold(_EXCLUSIVE_WAIT_S):  # held or not: both steps check first
                await store.refresh()
                await store._write("migrate", store._add_key_columns)
                await store._write("index", store._ensure_scalar_indexes)
        return store

    async def _setup_pending(self) -> bool:
        """Whether ``_add_key_columns`` or ``_ensure_scalar_indexes`` has anything to do."""
        names = set((await self._table.schema()).names)
        indexed = {tuple(ix.columns) for ix in await self._table.list_indices()}
        return (
            any(k not in names for k in KEY_COLUMNS.values())
            or bool(indexed & {("user_id",), ("id",)})
            or any((column,) not in indexed for column, _ in _SCALAR_INDEXES)
        )

    async def _write(self, what: str, call: Callable[[], Awaitable[T]], attempts: int = 8) -> T:
        self.check_intact()
        try:
            return await retry_write(
                call, refresh=self.refresh, stats=self.contention, what=what, attempts=attempts
            )
        except DataLoss as exc:
            raise self._found_damaged(exc) from exc

    async def _read(self, call: Callable[[], Awaitable[T]]) -> T:
        self.check_intact()
        try:
            return await retry_read(call, refresh=self.refresh, stats=self.contention)
        except DataLoss as exc:
            raise self._found_damaged(exc) from exc

    def check_intact(self) -> None:
        """Raises ``DataLoss`` once the table was found damaged (callers that answer from memory, such as
        the in-memory index, ask this first: they must not serve a table that is known to be wrong)."""
        if self.damaged is not None:
            raise DataLoss(str(self.damaged))

    async def health(self) -> str | None:
        """Why long-term memory cannot serve (its table is damaged), or None."""
        return str(self.damaged) if self.damaged is not None else None

    def _found_damaged(self, exc: DataLoss) -> DataLoss:
        if self.damaged is None:
            detail = str(exc.__cause__ or exc)[:200]
            self.damaged = DataLoss(
                f"the long-term memory table is damaged ({self.location}: a data file is truncated or"
                " overwritten): restore that directory from a backup, or move it aside to start empty,"
                f" then restart the sidecar; its reads and writes are refused until then ({detail})"
            )
            log.error("%s", self.damaged)  # once: the line an operator acts on
        return DataLoss(str(self.damaged))

    async def _add_key_columns(self) -> None:
        """Migration of tables written before key columns existed (memlane 0.1): compute the digests
        in place. The SQL's sha256 over the UTF-8 value equals ``filters.key`` (tested)."""
        names = set((await self._table.schema()).names)
        missing = {
            k: f"encode(sha256(coalesce(`{column}`, '')), 'hex')"
            for column, k in KEY_COLUMNS.items()
            if k not in names
        }
        if missing:
            log.info("memory store: adding key columns %s", sorted(missing))
            await self._table.add_columns(missing)
        # The indexes of 0.1 on the raw columns: replaced by those on the digests, and an index on
        # user_id would keep an erased user's id on disk.
        for ix in await self._table.list_indices():
            if tuple(ix.columns) in (("user_id",), ("id",)):
                await self._table.drop_index(ix.name)

    async def _ensure_scalar_indexes(self, *, rebuild: bool = False) -> None:
        have = {tuple(ix.columns) for ix in await self._table.list_indices()}
        for column, config in _SCALAR_INDEXES:
            if rebuild or (column,) not in have:
                await self._table.create_index(column, config=config, replace=True)

    @property
    def writes_since_optimize(self) -> int:
        return self._writes_since_optimize

    async def refresh(self) -> None:
        """Move to the table's latest version: another process (a sidecar sharing the store) wrote it.
        Without this a handle keeps reading the version it last wrote or opened."""
        await self._table.checkout_latest()  # type: ignore[no-untyped-call]  # lancedb leaves it untyped

    async def count(self, where: Expr | None = None) -> int:
        """Counted by LanceDB, no row leaves it. The predicate goes as SQL text: ``checked`` has just
        verified that text holds no literal but digests, enum words and numbers."""
        if where is None:
            return int(await self._read(self._table.count_rows))
        sql = checked(where).to_sql()
        return int(await self._read(lambda: self._table.count_rows(sql)))

    # Writes: each is retried whole on the latest version when its commit loses to another sidecar's
    # (``sharing.retry_write``); a refused commit wrote nothing, so running it again is safe.

    # Ownership is part of a row's identity: a write matches rows by (user, id), never by id alone, and
    # an id stays unique in the table whoever holds it. So ``add`` and ``upsert`` join on the id (one
    # row per id, never a second) and change only a row the item's own user holds; a batch naming an
    # id another user holds is refused (``model.id_unavailable``) before anything is written. The
    # conditional merge also holds against a claim made between that check and the commit (another
    # user, another sidecar): the other's row is never touched, and the write is refused after all.

    async def add(self, items: list[MemoryItem]) -> None:
        """Inserts the rows whose id no row holds yet (one table version for the batch); an id the
        item's own user holds already is left as it is (a re-run adds nothing)."""
        if not items:
            return
        await self._refuse_taken(items)
        data = self._arrow(items)

        async def insert() -> Any:
            return await self._table.merge_insert("id_key").when_not_matched_insert_all().execute(data)

        result = await self._write("add", insert)
        self._writes_since_optimize += 1
        if int(result.num_inserted_rows) < len(items):  # held already: by the user (a re-run), or not
            await self._refuse_taken(items)

    async def upsert(self, items: list[MemoryItem]) -> None:
        """Replaces whole rows by (user, id), inserting those whose id no row holds (one table version
        for the batch)."""
        if not items:
            return
        await self._refuse_taken(items)
        data = self._arrow(items)

        async def merge() -> Any:
            return await (
                self._table.merge_insert("id_key")
                .when_matched_update_all(where=_SAME_USER)
                .when_not_matched_insert_all()
                .execute(data)
            )

        result = await self._write("upsert", merge)
        self._writes_since_optimize += 1
        if int(result.num_updated_rows) + int(result.num_inserted_rows) < len(items):
            await self._refuse_taken(items)

    def _arrow(self, items: list[MemoryItem]) -> pa.Table:
        seen: set[str] = set()
        for item in items:
            if item.id in seen:  # two rows of one id: the table would no longer say which is the item
                raise ValueError(f"memory id {item.id!r} appears twice in one write")
            seen.add(item.id)
        return pa.Table.from_pylist([to_row(i) for i in items], schema=table_schema(self._ndims))

    async def _refuse_taken(self, items: list[MemoryItem]) -> None:
        users: dict[str, list[str]] = {}
        for item in items:
            users.setdefault(item.user_id, []).append(item.id)
        for user_id, ids in users.items():
            taken = await self.held_by_others(user_id, ids)
            if taken:
                raise id_unavailable(min(taken))

    async def held_by_others(self, user_id: str, ids: Sequence[str]) -> set[str]:
        """Which of ``ids`` rows of users other than ``user_id`` hold, and no row of ``user_id``: a write
        of ``user_id`` naming one of them is refused. (An id both hold is a duplicate written before
        ownership was enforced: the user's own row stays the user's to write, the other is never
        touched.) For checking a whole batch (an import file, a restore) before anything is written;
        its answer goes to a caller only as ``model.id_unavailable``."""
        wanted = sorted({i for i in ids if i})
        mine = filters.key(user_id)
        others: set[str] = set()
        own: set[str] = set()
        for start in range(0, len(wanted), _ID_BATCH):
            found = await self.fetch_columns(
                filters.with_ids(wanted[start : start + _ID_BATCH]), ["id", "user_key"]
            )
            for memory_id, user_key in zip(
                found["id"].to_pylist(), found["user_key"].to_pylist(), strict=True
            ):
                (own if user_key == mine else others).add(str(memory_id))
        return others - own

    async def update(self, where: Expr, values_sql: dict[str, str]) -> None:
        """SQL-expression update; ``values_sql`` must be built from trusted numbers/columns only."""
        sql = checked(where).to_sql()
        await self._write("update", lambda: self._table.update(where=sql, updates_sql=values_sql))
        self._writes_since_optimize += 1

    async def delete(self, where: Expr) -> None:
        sql = checked(where).to_sql()
        await self._write("delete", lambda: self._table.delete(sql))
        self._writes_since_optimize += 1

    async def erase(self, where: Expr) -> int:
        """Deletes the matching rows so that none of their bytes stay under the table's directory.

        A delete only marks rows in a deletion file, and compaction rewrites a fragment only once
        enough of it is deleted; indexes keep the rows' terms and vectors until rebuilt; old versions,
        manifests and transaction files keep the rest. So: move the other rows of every fragment that
        holds erased rows into new fragments (an update that rewrites them unchanged), delete (those
        fragments are then wholly deleted and dropped), rebuild the indexes, drop every older
        version. In that order a crash at any step is repaired by a retry: the rows are found until
        the delete, and the last two steps run on every call. Returns how many rows were erased.
        O(table): erasure is rare, and this is what it costs to mean it.

        Holds the table lock (no other sidecar compacts or indexes meanwhile, see ``sharing``) and runs
        whole again if a step's commit loses to another sidecar's write.
        """
        async with self._lock.hold(_EXCLUSIVE_WAIT_S) as held:
            if not held:
                raise Unavailable("the memory table is busy (another sidecar's compaction); retry")
            await self.refresh()
            return await self._write("erase", lambda: self._erase(checked(where)))

    async def _erase(self, where: Expr) -> int:
        found = await self._table.query().where(checked(where)).with_row_id().select(["id_key"]).to_arrow()
        # Tables here use unstable row ids, where a row id is its address: fragment id << 32 | offset.
        for fragment in sorted({int(rid) >> 32 for rid in found["_rowid"].to_pylist()}):
            span = (col("_rowid") >= lit(fragment << 32)) & (col("_rowid") < lit((fragment + 1) << 32))
            await self._table.update(where=checked(span & ~where).to_sql(), updates_sql={"id": "id"})
        if found.num_rows:
            await self._table.delete(checked(where).to_sql())
        await self._ensure_scalar_indexes(rebuild=True)
        if ("vector",) in {tuple(ix.columns) for ix in await self._table.list_indices()}:
            await self._table.create_index("vector", config=IvfHnswSq(distance_type="cosine"), replace=True)
        await self._optimize(timedelta(0))
        return int(found.num_rows)

    async def fetch(
        self, where: Expr, *, with_vector: bool = False, limit: int | None = None
    ) -> list[MemoryItem]:
        columns = [*META_COLUMNS, "vector"] if with_vector else META_COLUMNS
        query = self._table.query().where(checked(where)).select(columns)
        query = query.limit(limit) if limit is not None else query.limit(1_000_000)
        rows = await self._read(query.to_list)
        return [from_row(r) for r in rows]

    async def newest_keys(self, where: Expr, limit: int) -> list[tuple[int, str]]:
        """(created ms, id) of the ``limit`` newest matching items, newest first by (created_at_ms,
        id_key): the order of ``filters.after_cursor``, which a keyset page adds to ``where``. Only these
        short columns are read for the matching rows (LanceDB keeps the top ``limit`` while it scans);
        the caller then fetches the page's items by id, so a page costs its own rows, not the user's."""
        query = (
            self._table.query()
            .where(checked(where))
            .select(["created_at_ms", "id"])
            # Without the row id, LanceDB 0.40 fails to plan this sort once an erasure has rewritten
            # fragments ("TakeExec requires ... '_rowaddr' or '_rowid'"); test_paging.py holds it.
            .with_row_id()
            .order_by(_NEWEST_FIRST)
            .limit(limit)
        )
        rows = await self._read(query.to_list)
        return [(int(r["created_at_ms"]), str(r["id"])) for r in rows]

    async def fetch_columns(self, where: Expr | None, columns: list[str]) -> pa.Table:
        query = self._table.query().select(columns)
        if where is not None:
            query = query.where(checked(where))
        return await self._read(query.to_arrow)

    async def keyword_search(self, text: str, where: Expr, limit: int) -> list[Hit]:
        terms = " ".join(content_terms(text))
        if not terms:
            return []
        query = (
            self._table.query()
            .nearest_to_text(terms, columns="search_text")
            .where(checked(where))
            .select([*META_COLUMNS, "_score"])
            .limit(limit)
        )
        rows = await self._read(query.to_list)
        return [Hit(from_row(r), float(r["_score"])) for r in rows]

    async def vector_search(self, vector: npt.NDArray[np.float32], where: Expr, limit: int) -> list[Hit]:
        query = (
            self._table.query()
            .nearest_to(vector.astype(np.float32))
            .distance_type("cosine")
            .where(checked(where))
            .select([*META_COLUMNS, "_distance"])
            .limit(limit)
        )
        rows = await self._read(query.to_list)
        return [Hit(from_row(r), 1.0 - float(r["_distance"])) for r in rows]

    async def optimize(self, *, cleanup_older_than: timedelta = timedelta(minutes=10)) -> bool:
        """Compact fragments, fold new rows into the indexes, drop old versions. False if skipped: another
        sidecar sharing the table is compacting it right now (its pass covers this one's writes)."""
        self._writes_since_optimize = 0
        if self.damaged is not None:  # nothing is written into a damaged table (health says why)
            return False
        async with self._lock.hold(0) as held:
            if not held:
                self.contention.skipped_busy += 1
                log.info("LTM compaction skipped: another sidecar holds the table lock")
                return False
            await self.refresh()
            try:
                await self._optimize(cleanup_older_than)
            except LANCE_ERRORS as exc:
                # Lost to a concurrent write: not worth holding the lock (an erasure may be waiting for
                # it) to compact again at once; the next round does, from the latest version.
                if not (is_conflict(exc) or is_stale(exc)):
                    raise
                self.contention.skipped_busy += 1
                log.info("LTM compaction skipped: lost its commit to a concurrent write (%s)", str(exc)[:160])
                return False
            return True

    async def _optimize(self, cleanup_older_than: timedelta) -> None:
        await self._table.optimize(cleanup_older_than=cleanup_older_than)

    async def ensure_vector_index(self, min_rows: int) -> bool:
        """Build the ANN index once the table is big enough to need one; True if it exists now.

        Below ``min_rows`` a brute-force scan over the user's prefiltered rows is exact and fast.
        """
        have = {tuple(ix.columns) for ix in await self._read(self._table.list_indices)}
        if ("vector",) in have:
            return True
        if await self._read(self._table.count_rows) < min_rows:
            return False
        async with self._lock.hold(0) as held:
            if not held:  # another sidecar is compacting or indexing: next round
                self.contention.skipped_busy += 1
                return False
            await self.refresh()
            if ("vector",) not in {tuple(ix.columns) for ix in await self._table.list_indices()}:
                config = IvfHnswSq(distance_type="cosine")
                await self._write("index", lambda: self._table.create_index("vector", config=config))
            return True

    def close(self) -> None:
        # lancedb leaves these two untyped; both just drop the native handles.
        self._table.close()  # type: ignore[no-untyped-call]
        self._db.close()  # type: ignore[no-untyped-call]
