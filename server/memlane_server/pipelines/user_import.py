"""Restoring a user from an export file (ImportUserData): the inverse of ``UserData.export``.

What is written back: sessions (their documents as they were: status, times, summary), their messages
(ids and order kept), long-term memory items (ids, provenance and state kept; vectors made again by this
sidecar's model, so a file from a sidecar with another model still recalls right), the items' version
history at the times it was made, and snapshots. What is not: turn traces (a record of what one
assembly saw, not memory), framework checkpoints and archived rows (kept by the archive's own
retention); they are counted in ``not_restored``.

Every record is read as hostile input: it passes the checks the RPC that first wrote it applies (the id
grammar, the bounds of a message, the content rules of memory) and must belong to the file's user.
Ids are kept, and a record whose id is held already is left as it is: importing the same file twice
writes nothing the second time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from ..errors import AlreadyExists, InvalidArgument
from ..ids import check_id
from ..ltm import MemoryService
from ..ltm.history import ChangeReason, MemoryHistory, item_bytes
from ..ltm.ingest import embedding_text
from ..ltm.model import MemoryItem
from ..ltm.schema import from_row
from ..sessions.codec import decode_session
from ..sessions.limits import Limits, check_batch, check_list, check_metadata
from ..sessions.model import Message, Role, Session, VisibilityKind
from ..sessions.store import SessionStore, now_ms
from .export_format import ExportFile

NOT_RESTORED = ("trace", "checkpoint", "procedure")  # and every "archive.<dataset>"
_BATCH = 500  # messages restored per Redis round trip, items embedded per call


@dataclass(slots=True)
class ImportReceipt:
    user_id: str
    imported: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    not_restored: dict[str, int] = field(default_factory=dict)

    def count(self, into: dict[str, int], kind: str, n: int = 1) -> None:
        if n:
            into[kind] = into.get(kind, 0) + n


def _bad(number: int, kind: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"line {number} ({kind}): {why}", field="data")


class UserImport:
    def __init__(
        self, sessions: SessionStore, memory: MemoryService | None, history: MemoryHistory | None
    ) -> None:
        self._sessions = sessions
        self._memory = memory
        self._history = history
        self._limits = Limits()

    async def held(self, user_id: str) -> tuple[set[str], set[str]]:
        """The user's session ids and memory ids held here."""
        sids = set(await self._sessions.session_ids_of_user(user_id))
        mids: set[str] = set()
        if self._memory is not None:
            mids = {i.id for i in await self._memory.export_user(user_id)}
        return sids, mids

    async def run(self, file: ExportFile, *, merge: bool) -> ImportReceipt:
        user = file.user_id
        receipt = ImportReceipt(user)
        by_kind: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        for number, kind, record in file.records:
            if kind in NOT_RESTORED or kind.startswith("archive."):
                receipt.count(receipt.not_restored, kind)
                continue
            if kind not in ("session", "message", "memory", "memory_version", "memory_snapshot"):
                raise _bad(number, kind, "not a record type of this format")
            if record.get("user_id", user) != user:
                raise _bad(number, kind, "belongs to another user than the header's")
            by_kind.setdefault(kind, []).append((number, record))
        sessions = [_session(n, r, user) for n, r in by_kind.get("session", [])]
        items = [self._item(n, r, user) for n, r in by_kind.get("memory", [])]
        sids, mids = await self.held(user)
        if (sids or mids) and not merge:
            if {s.session_id for s in sessions} <= sids and {i.id for i in items} <= mids:
                merge = True  # the same file again: every record is held, nothing will be written
            else:
                raise AlreadyExists(
                    f"user {user!r} already has data on this sidecar; import with merge"
                    " (memlane import-user --merge) to add the file's records to it"
                )
        fresh: set[str] = set()
        for s in sessions:
            if s.session_id in sids or not await self._sessions.import_session(s):
                receipt.count(receipt.skipped, "session")
            else:
                fresh.add(s.session_id)
                receipt.count(receipt.imported, "session")
        await self._messages(
            by_kind.get("message", []), fresh, sids | {s.session_id for s in sessions}, receipt
        )
        await self._items([i for i in items if i.id not in mids], receipt)
        receipt.count(receipt.skipped, "memory", sum(1 for i in items if i.id in mids))
        await self._versions(user, by_kind.get("memory_version", []), receipt)
        await self._snapshots(user, by_kind.get("memory_snapshot", []), receipt)
        return receipt

    async def _messages(
        self,
        records: list[tuple[int, dict[str, Any]]],
        fresh: set[str],
        known: set[str],
        receipt: ImportReceipt,
    ) -> None:
        """Into the sessions this import created; a session held already keeps its own turns."""
        by_session: dict[str, list[Message]] = {}
        for number, record in records:
            m = _message(number, record)
            if m.session_id not in known:
                raise _bad(number, "message", f"session {m.session_id!r} is not a session of the file's user")
            if m.session_id not in fresh:
                receipt.count(receipt.skipped, "message")
                continue
            by_session.setdefault(m.session_id, []).append(m)
        for sid, messages in by_session.items():
            for start in range(0, len(messages), _BATCH):
                batch = messages[start : start + _BATCH]
                check_batch(batch, self._limits, now_ms())
                await self._sessions.restore(sid, batch)
            receipt.count(receipt.imported, "message", len(messages))

    def _item(self, number: int, record: dict[str, Any], user: str) -> MemoryItem:
        if self._memory is None:
            raise _bad(number, "memory", "long-term memory is off on this sidecar")
        try:
            item = from_row({**record, "metadata_json": orjson.dumps(record.get("metadata") or {}).decode()})
        except (KeyError, TypeError, ValueError) as exc:
            raise _bad(number, "memory", f"a field does not parse ({type(exc).__name__})") from None
        _check_item(item, number, user, self._limits)
        item.content = self._memory.check_content(item.content)
        return item

    async def _items(self, items: list[MemoryItem], receipt: ImportReceipt) -> None:
        if not items or self._memory is None:
            return
        for start in range(0, len(items), _BATCH):
            batch = items[start : start + _BATCH]
            vectors = await self._memory.embed([embedding_text(i.content, i.keywords) for i in batch])
            for item, vector in zip(batch, vectors, strict=True):
                item.vector = vector.tolist()
            await self._memory.store.add(batch)
        await self._memory.changed(items[0].user_id)
        receipt.count(receipt.imported, "memory", len(items))

    async def _versions(
        self, user: str, records: list[tuple[int, dict[str, Any]]], receipt: ImportReceipt
    ) -> None:
        if not records or self._history is None:
            return
        rows = []
        for number, r in records:
            item = self._doc(number, "memory_version", r.get("item"), user)
            try:
                reason = ChangeReason[str(r.get("reason", "")).upper()]
                at_ms, actor, deleted = (
                    int(r["changed_at_ms"]),
                    str(r.get("changed_by") or ""),
                    r.get("deleted"),
                )
            except (KeyError, TypeError, ValueError):
                raise _bad(
                    number, "memory_version", "reason, changed_at_ms or changed_by does not parse"
                ) from None
            check_id(actor, f"line {number}: changed_by", required=False)
            if item.id != r.get("memory_id") or not isinstance(deleted, bool) or at_ms < 0:
                raise _bad(number, "memory_version", "memory_id, deleted or changed_at_ms is not valid")
            rows.append((item.id, int(reason), actor, at_ms, deleted, item_bytes(item)))
        written = await self._history.import_versions(user, rows)
        receipt.count(receipt.imported, "memory_version", written)
        receipt.count(receipt.skipped, "memory_version", len(rows) - written)

    async def _snapshots(
        self, user: str, records: list[tuple[int, dict[str, Any]]], receipt: ImportReceipt
    ) -> None:
        if not records or self._history is None:
            return
        backend = self._history.snapshots
        for number, r in records:
            desc = {k: v for k, v in r.items() if k != "items"}
            sid, created = desc.get("snapshot_id"), desc.get("created_at_ms")
            if not isinstance(sid, str) or not isinstance(created, int) or desc.get("user_id") != user:
                raise _bad(number, "memory_snapshot", "snapshot_id, created_at_ms or user_id is not valid")
            check_id(sid, f"line {number}: snapshot_id")
            docs = r.get("items")
            if not isinstance(docs, list):
                raise _bad(number, "memory_snapshot", "items is not a list")
            items = {
                i.id: item_bytes(i) for i in (self._doc(number, "memory_snapshot", d, user) for d in docs)
            }
            try:
                await backend.reserve(user, sid, created)
            except AlreadyExists:
                receipt.count(receipt.skipped, "memory_snapshot")
                continue
            await backend.write(user, sid, orjson.dumps(desc), items)
            receipt.count(receipt.imported, "memory_snapshot")

    def _doc(self, number: int, kind: str, doc: object, user: str) -> MemoryItem:
        """An item as versions and snapshots hold it (its stored columns)."""
        if not isinstance(doc, dict):
            raise _bad(number, kind, "item is not an object")
        try:
            item = from_row(doc)
        except (KeyError, TypeError, ValueError) as exc:
            raise _bad(number, kind, f"an item field does not parse ({type(exc).__name__})") from None
        _check_item(item, number, user, self._limits)
        return item


def _check_item(item: MemoryItem, number: int, user: str, limits: Limits) -> None:
    if item.user_id != user:
        raise _bad(number, "memory", "belongs to another user than the header's")
    texts = (item.id, item.agent_id, item.group, item.channel, item.superseded_by, item.source_session_id)
    if not (
        all(isinstance(t, str) for t in (*texts, item.content, item.slot))
        and _strings(item.keywords)
        and _strings(item.source_message_ids)
        and _string_map(item.metadata)
        and 0.0 <= item.importance <= 1.0
    ):
        raise _bad(number, "memory", "a field has the wrong type, or importance is outside [0, 1]")
    check_id(item.id, f"line {number}: id")
    for name in ("agent_id", "group", "channel", "superseded_by"):
        check_id(getattr(item, name), f"line {number}: {name}", required=False)
    check_id(item.source_session_id, f"line {number}: source_session_id", required=False)
    check_list(item.keywords, f"line {number}: keywords", limits)
    check_list(item.source_message_ids, f"line {number}: source_message_ids", limits)
    for i, mid in enumerate(item.source_message_ids):
        check_id(mid, f"line {number}: source_message_ids[{i}]")
    check_metadata(item.metadata, f"line {number}: metadata", limits)


def _session(number: int, record: dict[str, Any], user: str) -> Session:
    if not all(isinstance(v, str | int) and not isinstance(v, bool) for v in record.values()):
        raise _bad(number, "session", "every field of a session document is a string or an integer")
    try:
        s = decode_session({str(k).encode(): str(v).encode() for k, v in record.items()})
    except (KeyError, TypeError, ValueError, orjson.JSONDecodeError) as exc:
        raise _bad(number, "session", f"a field does not parse ({type(exc).__name__})") from None
    if s.user_id != user:
        raise _bad(number, "session", "belongs to another user than the header's")
    if not (_strings(s.participants) and _strings(s.tags) and _string_map(s.metadata)):
        raise _bad(number, "session", "participants, tags or metadata is not valid")
    check_id(s.session_id, f"line {number}: session_id")
    return s


_ROLES = {r.name.lower(): r for r in Role}
_MESSAGE_TEXTS = (
    *("message_id", "session_id", "content", "source_agent_id", "participant_name", "user_id"),
    *("channel", "native_format", "native_json", "visibility_group"),
)
_VISIBILITIES = {v.name.lower(): v for v in VisibilityKind}


def _message(number: int, record: dict[str, Any]) -> Message:
    fields = set(Message.__dataclass_fields__)
    try:
        values = {k: v for k, v in record.items() if k in fields}
        m = Message(
            **{
                **values,
                "role": _ROLES[str(record.get("role"))],
                "visibility": _VISIBILITIES[str(record.get("visibility", "session"))],
            }
        )
    except (KeyError, TypeError) as exc:
        raise _bad(number, "message", f"a field does not parse ({type(exc).__name__})") from None
    lists = (m.planning_steps, m.invoked, m.tool_call_ids)
    numbers = (m.seq, m.created_at_ms, m.token_count)
    if not (
        all(isinstance(getattr(m, f), str) for f in _MESSAGE_TEXTS)
        and all(_strings(v) for v in lists)
        and _string_map(m.metadata)
        and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in numbers)
        and m.seq >= 1
        and isinstance(m.transient, bool)
    ):
        raise _bad(number, "message", "a field has the wrong type, or seq is not positive")
    check_id(m.message_id, f"line {number}: message_id")
    check_id(m.session_id, f"line {number}: session_id")
    return m


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _string_map(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )
