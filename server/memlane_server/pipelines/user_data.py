"""Per-user export and erasure (GDPR) across every store: Redis, LanceDB and the archive.

Erasure order matters: the Redis session index is what names a user's sessions, so the archive and
LanceDB are cleared first and the Redis keys (index included) last; a crash midway leaves the index in
place and a retry finds everything again. Every step is idempotent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from ..checkpoints.store import CheckpointStore, export_checkpoints
from ..errors import Unavailable
from ..ltm import MemoryService
from ..ltm.history import MemoryHistory
from ..sessions.leases import ErasureJournal, sessions_held
from ..sessions.model import Message
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
        """Everything held about the user, one record at a time, kind by kind."""
        sids = await self._sessions.session_ids_of_user(user_id)
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
            for item in await self._memory.export_user(user_id):
                record = asdict(item)
                record.pop("vector", None)  # a derived embedding, not the user's data
                yield "memory", record
        if self._history is not None:
            for kind, record in await self._history.export(user_id):
                yield kind, record
        if self._procedures is not None:
            for proc in await self._procedures.export_user(user_id):
                yield "procedure", dict(proc)
        if self._archive is not None:
            files = await self._archive.user_files(user_id, set(sids), self._owners)
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

    async def _erase_held(self, user_id: str) -> dict[str, int]:
        sids = await self._sessions.session_ids_of_user(user_id)
        async with sessions_held(self._sessions.redis, self._sessions.keys, sids):
            return await self._erase(user_id, sids)

    async def _erase(self, user_id: str, sids: list[str]) -> dict[str, int]:
        counts: dict[str, int] = {}
        if self._archive is not None:
            files = await self._archive.user_files(user_id, set(sids), self._owners)
            counts.update(await self._archive.delete_files(files))
        if self._memory is not None:
            counts["lancedb.items"] = await self._memory.erase_user(user_id)
        if self._procedures is not None:
            # Before the per-user keys go: the user's index of procedure versions is one of them.
            counts["redis.procedure_versions"] = await self._procedures.erase_user(user_id)
        if self._history is not None:
            # Memory versions and snapshots are per-user keys: erase_user below deletes them.
            counts.update(await self._history.sizes(user_id))
        # Before the session keys go: drops the sessions from the cross-session run index.
        await self._checkpoints.forget_runs_of(sids)
        counts.update(await self._sessions.erase_user(user_id))
        for forget in self._caches:
            forget(user_id, set(sids))
        return counts
