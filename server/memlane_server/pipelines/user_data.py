"""Per-user data across every store (Redis, LanceDB and the archive): export and erasure (GDPR), the
directory of users memlane holds data about, and the export file's format (which ``user_import`` reads).

Erasure order matters: the Redis session index is what names a user's sessions, so the archive and
LanceDB are cleared first and the Redis keys (index included) last; a crash midway leaves the index in
place and a retry finds everything again. Every step is idempotent.

Erasure reaches every form of the id: requests carry ids in NFC, but rows written before that (or by an
import that kept a file's NFD id) hold the id as it was sent, so each store is erased under every stored
form that normalizes to the same id (``ids.equivalent_forms``), LanceDB in one predicate over their digests.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import orjson

import memlane

from ..checkpoints.store import CheckpointStore, export_checkpoints
from ..errors import FailedPrecondition, InvalidArgument, Unavailable
from ..ids import check_id, equivalent_forms, normalized
from ..ltm import MemoryService
from ..ltm.history import MemoryHistory
from ..paging import cursor_of, decode_token, encode_token, page_size, query_fingerprint
from ..sessions.leases import ErasureJournal, sessions_held
from ..sessions.model import Message, PromotionState, SessionStatus, Topology
from ..sessions.store import SessionStore, with_session_defaults
from .archive import ParquetArchive

log = logging.getLogger("memlane")

Record = tuple[str, dict[str, Any]]  # (kind, JSON-ready record)


class SessionTraces(Protocol):
    """A session's turn traces as export records (``context/traces.py TraceStore``: assembly writes and
    reads them back with their turns; erasure goes with the session's keys)."""

    def export(self, session_id: str) -> AsyncIterator[dict[str, Any]]: ...


class UserProcedures(Protocol):
    """Procedure versions learned from a user's sessions (``procedures.ProcedureService``): per agent, but
    they quote the user's turns, so they are the user's data too."""

    async def export_user(self, user_id: str) -> list[dict[str, object]]: ...

    async def erase_user(self, user_id: str) -> int: ...


def _message_record(m: Message) -> dict[str, Any]:
    d = asdict(m)
    d["role"] = m.role.name.lower()
    d["visibility"] = m.visibility.name.lower()
    return d


@dataclass(slots=True)
class ErasureReceipt:
    erased: dict[str, int]  # counts per store and kind
    completed_at_ms: int
    # What the operator must still do before no byte of the user is left on disk (empty: nothing).
    operator_actions: list[str] = field(default_factory=list)
    rewritten: list[str] = field(default_factory=list)  # persistence files rewritten: "redis.aof"...


class UserData:
    def __init__(
        self,
        sessions: SessionStore,
        traces: SessionTraces,
        memory: MemoryService | None,
        archive: ParquetArchive | None,
        *,
        checkpoints: CheckpointStore,
        caches: Sequence[Callable[[str, set[str]], None]] = (),
        history: MemoryHistory | None = None,
        procedures: UserProcedures | None = None,
        journal: ErasureJournal | None = None,
    ) -> None:
        self._journal = journal
        self._history = history
        self._procedures = procedures
        self._sessions = sessions
        self._traces = traces
        self._memory = memory
        self._archive = archive
        self._checkpoints = checkpoints
        # In-process copies of user data (decoded recent turns, profiles): each is told (user, sessions).
        self._caches = caches

    async def _owners(self, session_ids: list[str]) -> dict[str, str]:
        """The user of each session that has a Redis document (the archive need not be read for it)."""
        out: dict[str, str] = {}
        for start in range(0, len(session_ids), 500):
            chunk = session_ids[start : start + 500]
            for sid, doc in zip(chunk, await self._sessions.get_many(chunk), strict=True):
                if doc is not None:
                    out[sid] = doc.user_id
        return out

    async def export(self, user_id: str) -> AsyncIterator[Record]:
        """Everything held about the user (under every form of the id, as erasure finds it), one record
        at a time, kind by kind."""
        forms = await self._forms(user_id)
        sids = await self._sessions_of(forms)
        docs = await self._sessions.get_many(sids)
        for doc in docs:
            if doc is not None:
                yield "session", self._sessions.export_record(doc)
        for sid, doc in zip(sids, docs, strict=True):
            user, channel = (doc.user_id, doc.channel) if doc is not None else (user_id, "")
            async for m in self._sessions.all_messages(sid):
                yield "message", _message_record(with_session_defaults(m, user, channel))
        for sid in sids:
            async for trace in self._traces.export(sid):
                yield "trace", trace
        async for checkpoint in export_checkpoints(self._checkpoints, sids):
            yield "checkpoint", checkpoint
        if self._memory is not None:
            for item in await self._memory.export_user(*forms):
                record = asdict(item)
                record.pop("vector", None)  # a derived embedding, not the user's data
                yield "memory", record
        for form in forms:
            if self._history is not None:
                for kind, record in await self._history.export(form):
                    yield kind, record
            if self._procedures is not None:
                for proc in await self._procedures.export_user(form):
                    yield "procedure", dict(proc)
        if self._archive is not None:
            files = await self._archive_files(self._archive, forms, sids)
            for dataset, rows in await self._archive.export_rows(files):
                for row in rows:
                    yield f"archive.{dataset}", row

    async def erase(self, user_id: str, *, wait_s: float = 60.0) -> ErasureReceipt:
        """Erases the user everywhere, persistence files included; returns the receipt. Runs holding the
        leases of the user's sessions, so no session end writes their turns again behind it, and inside
        the erasure journal, so an erasure whose sidecar dies is finished by another
        (``resume_orphans``)."""
        if self._journal is None:
            counts = await self._erase_held(user_id)
        else:
            async with self._journal.running(user_id, wait_s):
                counts = await self._erase_held(user_id)
        # Last, once the journal holds no trace of the user either: Redis's files on disk still hold
        # what the deletes above removed from memory.
        persisted = await self._sessions.rewrite_persistence()
        return ErasureReceipt(
            counts,
            time.time_ns() // 1_000_000,
            persisted.operator_actions,
            [f"redis.{kind}" for kind in persisted.rewritten],
        )

    async def resume_orphans(self) -> int:
        """Runs again every erasure that was started and is run by nobody (its sidecar died, or it
        failed); returns how many finished."""
        if self._journal is None:
            return 0
        done = 0
        for user_id in await self._journal.orphans():
            try:
                await self.erase(user_id, wait_s=0.0)
            except Unavailable:
                continue  # another sidecar took it meanwhile, or a store is down: the next round
            log.warning("finished an erasure its sidecar had left half done")
            done += 1
        return done

    async def _forms(self, user_id: str) -> list[str]:
        """The forms of ``user_id`` the stores hold data under (``ids.equivalent_forms``): users are read
        from where their data is, as the directory reads them."""
        check_id(user_id, "user_id")
        stored = (await self._sessions.users_with_sessions()).union(await _memory_users(self._memory))
        return equivalent_forms(user_id, stored)

    async def _sessions_of(self, forms: list[str]) -> list[str]:
        return sorted({sid for form in forms for sid in await self._sessions.session_ids_of_user(form)})

    async def _archive_files(
        self, archive: ParquetArchive, forms: list[str], sids: list[str]
    ) -> list[tuple[str, str]]:
        files: set[tuple[str, str]] = set()
        for form in forms:
            files.update(await archive.user_files(form, set(sids), self._owners))
        return sorted(files)

    async def _erase_held(self, user_id: str) -> dict[str, int]:
        forms = await self._forms(user_id)
        sids = await self._sessions_of(forms)
        async with sessions_held(self._sessions.redis, self._sessions.keys, sids):
            return await self._erase(forms, sids)

    async def _erase(self, forms: list[str], sids: list[str]) -> dict[str, int]:
        counts: Counter[str] = Counter()
        if self._archive is not None:
            counts.update(
                await self._archive.delete_files(await self._archive_files(self._archive, forms, sids))
            )
        if self._memory is not None:
            counts["lancedb.items"] = await self._memory.erase_user(*forms)
        for form in forms:
            if self._procedures is not None:
                # Before the per-user keys go: the user's index of procedure versions is one of them.
                counts["redis.procedure_versions"] += await self._procedures.erase_user(form)
            if self._history is not None:
                # Memory versions and snapshots are per-user keys: erase_user below deletes them.
                counts.update(await self._history.sizes(form))
        # Before the session keys go: drops the sessions from the cross-session run index.
        await self._checkpoints.forget_runs_of(sids)
        for form in forms:
            counts.update(await self._sessions.erase_user(form))
            for forget in self._caches:
                forget(form, set(sids))
        return dict(counts)


async def _memory_users(memory: MemoryService | None) -> list[str]:
    """The user of every long-term memory row (one column read)."""
    if memory is None:
        return []
    table = await memory.store.fetch_columns(None, ["user_id"])
    return [str(u) for u in table.column("user_id").to_pylist()]


# --- The user directory (ListUsers) ---------------------------------------------------------------------
# Which users memlane holds data about (ListUsers): those with a session index in Redis and those with
# long-term memory items, joined, counted, ordered by id and paged.
#
# There is no user table to keep in step with every write path: the directory is read from where the
# data is, so a user appears the moment anything is stored for them and is gone once erased. A listing
# scans the session indexes' key names and the memory table's user column, which is what an operator's
# page needs at the scale of one sidecar's users; the page itself is bounded like any other.

MAX_QUERY_CHARS = 128  # a user id is at most 128 characters: a longer text matches none
MAX_PAGE = 500


@dataclass(frozen=True, slots=True)
class UserSummary:
    user_id: str
    session_count: int
    memory_count: int
    last_session_at_ms: int


@dataclass(frozen=True, slots=True)
class UserPage:
    users: list[UserSummary]
    next_page_token: str
    total: int


class UserDirectory:
    def __init__(self, sessions: SessionStore, memory: MemoryService | None) -> None:
        self._sessions = sessions
        self._memory = memory

    async def _memory_counts(self) -> Counter[str]:
        return Counter(await _memory_users(self._memory))

    async def list(self, query: str, size: int, token: str, *, only: str = "") -> UserPage:
        """Users whose id contains ``query`` (case-insensitive), ordered by id; ``only``: a call bound to
        one end user sees that user alone."""
        if len(query) > MAX_QUERY_CHARS:
            raise InvalidArgument(f"query is longer than {MAX_QUERY_CHARS} characters")
        size = page_size(size, maximum=MAX_PAGE)
        fingerprint = query_fingerprint("users", query, only)
        cursor = decode_token(token, fingerprint)
        after = str(cursor_of(cursor, str)[0]) if cursor is not None else None
        memories = await self._memory_counts()
        ids = (await self._sessions.users_with_sessions()) | set(memories)
        needle = query.casefold()
        matching = sorted(u for u in ids if needle in u.casefold() and (not only or u == only))
        start = 0 if after is None else next((i for i, u in enumerate(matching) if u > after), len(matching))
        page = matching[start : start + size]
        counts = await self._sessions.session_counts(page)
        users = [
            UserSummary(u, n, memories.get(u, 0), last) for u, (n, last) in zip(page, counts, strict=True)
        ]
        more = start + size < len(matching)
        return UserPage(users, encode_token(fingerprint, [page[-1]]) if more and page else "", len(matching))


# --- The export file format ------------------------------------------------------------------------------
# The user export's file format (ExportUserData writes it, ImportUserData reads it; described for people
# in docs/operations.md#export-format).
#
# JSON lines. The first line is the header: ``{"record": "header", "format": "memlane.user-export",
# "format_version": 2, "memlane_version": ..., "user_id": ..., "exported_at_unix_ms": ...}``. Every other
# line is one record, an object whose ``record`` field names its type (``session``, ``message``,
# ``trace``, ``checkpoint``, ``memory``, ``memory_version``, ``memory_snapshot``, ``procedure``,
# ``archive.<dataset>``) beside the record's own fields.
#
# Version 2 names a thing the API also shows as the API's JSON does (memlane/_json.py, the CLI and the
# MCP tools): times ``*_unix_ms``, a memory's id ``memory_id``, a memory version's item ``memory``, a
# session's status, promotion state and topology by their short lowercase names. Version 1 wrote the
# stored names (``created_at_ms``, ``id``, ``item``, ``"status": 3``); the stores keep those, so ``tagged``
# renames on the way out and ``parse`` renames a version-2 file back, and the import reads both alike.
#
# A reader accepts its own format version and older ones; a newer file is refused (a field it cannot read
# may carry meaning), never half read.

FORMAT = "memlane.user-export"
FORMAT_VERSION = 2
TYPE_FIELD = "record"
HEADER = "header"
# The records whose fields version 2 renames: those the API shows too. Traces, checkpoints and archived
# rows keep their own fields (a checkpoint is a framework's object, not memlane's to rename).
_NAMED_LIKE_THE_API = frozenset(
    {"session", "message", "memory", "memory_version", "memory_snapshot", "procedure"}
)
_SESSION_ENUMS: dict[str, type[SessionStatus | PromotionState | Topology]] = {
    "status": SessionStatus,
    "promotion_state": PromotionState,
    "topology": Topology,
}
_STORED_MS, _API_MS = "_ms", "_unix_ms"
_RENAMED = {"memory": {"id": "memory_id"}, "memory_version": {"item": "memory"}}  # stored name: the file's
_ITEMS = {"memory_version": "item", "memory_snapshot": "items"}  # the stored memories a record holds


def header(user_id: str) -> dict[str, Any]:
    return {
        TYPE_FIELD: HEADER,
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "memlane_version": memlane.__version__,
        "user_id": user_id,
        "exported_at_unix_ms": time.time_ns() // 1_000_000,
    }


def tagged(kind: str, record: dict[str, Any]) -> dict[str, Any]:
    """The record as a line holds it: its type first, then its own fields under the file's names."""
    fields = {k: v for k, v in record.items() if k != TYPE_FIELD}
    return {TYPE_FIELD: kind, **(_api_names(kind, fields) if kind in _NAMED_LIKE_THE_API else fields)}


def _file_key(kind: str, key: str) -> str:
    if key.endswith(_STORED_MS) and not key.endswith(_API_MS):
        return key.removesuffix(_STORED_MS) + _API_MS
    return _RENAMED.get(kind, {}).get(key, key)


def _stored_key(kind: str, key: str) -> str:
    if key.endswith(_API_MS):
        return key.removesuffix(_API_MS) + _STORED_MS
    return next((old for old, new in _RENAMED.get(kind, {}).items() if new == key), key)


def _api_names(kind: str, record: dict[str, Any]) -> dict[str, Any]:
    """A record's stored fields under version 2's names."""
    return {_file_key(kind, k): _api_value(kind, k, v) for k, v in record.items()}


def _api_value(kind: str, key: str, value: Any) -> Any:
    if kind == "session" and key in _SESSION_ENUMS and isinstance(value, int):
        return _SESSION_ENUMS[key](value).name.lower()
    if _ITEMS.get(kind) != key:
        return value
    if isinstance(value, list):
        return [_api_names("memory", v) for v in value]
    return _api_names("memory", value)


def _stored_names(kind: str, record: dict[str, Any], number: int) -> dict[str, Any]:
    """A version-2 record under the stored names that the import checks read. A field named twice
    (under both versions' names), which no export writes, is refused rather than one of them dropped."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = _stored_key(kind, key)
        if name in out:
            raise InvalidArgument(f"line {number}: {kind} names the field {name!r} twice", field="data")
        out[name] = _stored_value(kind, name, value, number)
    return out


def _stored_value(kind: str, name: str, value: Any, number: int) -> Any:
    if kind == "session" and name in _SESSION_ENUMS and isinstance(value, str):
        enum = _SESSION_ENUMS[name]
        if value.upper() not in enum.__members__:
            names = ", ".join(m.lower() for m in enum.__members__)
            raise InvalidArgument(
                f"line {number}: session {name} {value[:40]!r} is none of {names}", field="data"
            )
        return enum[value.upper()].value
    if _ITEMS.get(kind) != name:
        return value
    # Anything but an object is left for the import checks to refuse, in their words.
    if isinstance(value, list):
        return [_stored_names("memory", v, number) if isinstance(v, dict) else v for v in value]
    return _stored_names("memory", value, number) if isinstance(value, dict) else value


@dataclass(frozen=True, slots=True)
class ExportFile:
    user_id: str
    format_version: int
    records: list[tuple[int, str, dict[str, Any]]]  # (line number, type, fields without the type)


def parse(data: bytes) -> ExportFile:
    """Reads whole lines; raises InvalidArgument naming the line at fault, FailedPrecondition for a
    format newer than this sidecar reads."""
    lines = data.split(b"\n")
    records: list[tuple[int, str, dict[str, Any]]] = []
    head: dict[str, Any] | None = None
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise InvalidArgument(f"line {number} is not JSON", field="data") from None
        kind = obj.get(TYPE_FIELD) if isinstance(obj, dict) else None
        if not isinstance(kind, str) or not kind:
            raise InvalidArgument(f"line {number} has no {TYPE_FIELD!r} field naming its type", field="data")
        if head is None:
            head = _header(obj, number)
            continue
        if kind == HEADER:
            raise InvalidArgument(f"line {number} is a second header", field="data")
        fields = {k: v for k, v in obj.items() if k != TYPE_FIELD}
        if head["format_version"] >= 2 and kind in _NAMED_LIKE_THE_API:
            fields = _stored_names(kind, fields, number)
        records.append((number, kind, fields))
    if head is None:
        raise InvalidArgument("data holds no lines: an export starts with its header line", field="data")
    return ExportFile(head["user_id"], head["format_version"], records)


def _header(obj: dict[str, Any], number: int) -> dict[str, Any]:
    if obj.get(TYPE_FIELD) != HEADER or obj.get("format") != FORMAT:
        raise InvalidArgument(
            f"line {number} is not the header of a memlane user export (format {FORMAT!r}); files"
            " written before the format had a header are not read",
            field="data",
        )
    version = obj.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidArgument("the header's format_version is not a positive integer", field="data")
    if version > FORMAT_VERSION:
        writer = str(obj.get("memlane_version"))[:40]
        raise FailedPrecondition(
            f"the file is format version {version}, written by memlane {writer!r}; this sidecar reads up"
            f" to version {FORMAT_VERSION}: import it with a newer memlane"
        )
    user_id = obj.get("user_id")
    if not isinstance(user_id, str):
        raise InvalidArgument("the header names no user_id", field="data")
    # In NFC, as every request's ids are (ids.py): the data lands under the form erasure finds.
    user_id = normalized(user_id)
    check_id(user_id, "header.user_id")
    return {**obj, "user_id": user_id}


def read_header(data: bytes) -> tuple[dict[str, Any], bytes]:
    """(the header, the lines after it) of a file or of one part of a file sent in parts."""
    first, _, rest = data.lstrip().partition(b"\n")
    try:
        obj = orjson.loads(first)
    except orjson.JSONDecodeError:
        raise InvalidArgument("line 1 is not JSON", field="data") from None
    if not isinstance(obj, dict):
        raise InvalidArgument("line 1 is not the header of a memlane user export", field="data")
    return _header(obj, 1), rest
