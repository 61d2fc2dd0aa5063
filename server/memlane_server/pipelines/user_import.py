"""Restoring a user from an export file (ImportUserData): the inverse of ``UserData.export``.

What is written back: sessions (their documents as they were: status, times, summary), their messages
(ids and order kept), long-term memory items (ids, provenance and state kept; vectors made again by this
sidecar's model, so a file from a sidecar with another model still recalls right), the items' version
history at the times it was made, snapshots, and the procedure versions learned from the user's
sessions: each as a proposal of its agent or group (``ProcedureService.propose``, so the PII rule and
the approval policy of this sidecar apply: a version the extractor wrote always waits for an operator,
and no version comes back active on its old approval). What is not: turn traces (a record of what one
assembly saw, not memory), framework checkpoints and archived rows (kept by the archive's own
retention); they are counted in ``not_restored``.

Every record is read as hostile input: it passes the checks the RPC that first wrote it applies (the id
grammar, the bounds of a message, the content rules of memory) and must belong to the file's user.
Ids are kept, and a record whose id is held already is left as it is: importing the same file twice
writes nothing the second time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..errors import AlreadyExists, InvalidArgument
from ..ids import check_id
from ..ltm import MemoryService, filters
from ..ltm.history import ChangeReason, ImportedVersion, MemoryHistory, item_bytes
from ..ltm.ingest import embedding_text
from ..ltm.model import MemoryItem
from ..ltm.schema import from_row
from ..procedures.service import ProcedureService, Proposal
from ..procedures.store import Kind, Origin, Owner
from ..sessions.codec import decode_session
from ..sessions.limits import Limits, check_batch, check_list, check_metadata, message_bytes
from ..sessions.model import Message, Role, Session, VisibilityKind
from ..sessions.store import SessionStore, now_ms
from .user_data import ExportFile

NOT_RESTORED = ("trace", "checkpoint")  # and every "archive.<dataset>"
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


def _call_sized(messages: list[Message], limits: Limits) -> Iterator[list[Message]]:
    """``messages`` in order, cut where one AppendMessages call would stop: at the batch's message count
    or its bytes. A message over the bytes alone is a batch of its own (and ``check_batch`` refuses it,
    as AppendMessages would)."""
    size = min(_BATCH, limits.max_batch_messages)
    batch: list[Message] = []
    total = 0
    for m in messages:
        cost = message_bytes(m)
        if batch and (len(batch) == size or total + cost > limits.max_batch_bytes):
            yield batch
            batch, total = [], 0
        batch.append(m)
        total += cost
    if batch:
        yield batch


class UserImport:
    def __init__(
        self,
        sessions: SessionStore,
        memory: MemoryService | None,
        history: MemoryHistory | None,
        procedures: ProcedureService | None,
        *,
        limits: Limits,
    ) -> None:
        self._sessions = sessions
        self._memory = memory
        self._history = history
        self._procedures = procedures
        # The configured ones (wiring/stores.py): a message this sidecar would not take in AppendMessages
        # is not restored either.
        self._limits = limits

    async def held(self, user_id: str) -> tuple[set[str], set[str]]:
        """The user's session ids and memory ids held here."""
        sids = set(await self._sessions.session_ids_of_user(user_id))
        mids: set[str] = set()
        if self._memory is not None:
            mids = {i.id for i in await self._memory.export_user(user_id)}
        return sids, mids

    async def run(self, file: ExportFile, *, merge: bool) -> ImportReceipt:
        """Reads and checks every record first, then writes: a file with one bad line writes nothing."""
        user = file.user_id
        receipt = ImportReceipt(user)
        by_kind: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        for number, kind, record in file.records:
            if kind in NOT_RESTORED or kind.startswith("archive."):
                receipt.count(receipt.not_restored, kind)
                continue
            if kind not in ("session", "message", "memory", "memory_version", "memory_snapshot", "procedure"):
                raise _bad(number, kind, "not a record type of this format")
            if record.get("user_id", user) != user:
                raise _bad(number, kind, "belongs to another user than the header's")
            by_kind.setdefault(kind, []).append((number, record))
        sessions = [_session(n, r, user) for n, r in by_kind.get("session", [])]
        items = [self._item(n, r, user) for n, r in by_kind.get("memory", [])]
        versions = self._versions(user, by_kind.get("memory_version", []))
        snapshots = [self._snapshot(user, n, r) for n, r in by_kind.get("memory_snapshot", [])]
        proposals = [self._proposal(user, n, r) for n, r in by_kind.get("procedure", [])]
        sids, mids = await self.held(user)
        await self._check_free(user, [s.session_id for s in sessions], [i.id for i in items])
        messages = self._messages(by_kind.get("message", []), sids | {s.session_id for s in sessions})
        if (sids or mids) and not merge:
            if {s.session_id for s in sessions} <= sids and {i.id for i in items} <= mids:
                merge = True  # the same file again: every record is held, nothing will be written
            else:
                raise AlreadyExists(
                    f"user {user!r} already has data on this sidecar; import with merge"
                    " (memlane import-user --merge) to add the file's records to it"
                )
        # Writes, in the order the data hangs together: sessions, their turns, items, their history.
        fresh: set[str] = set()
        for s in sessions:
            if s.session_id in sids or not await self._sessions.import_session(s):
                receipt.count(receipt.skipped, "session")
            else:
                fresh.add(s.session_id)
                receipt.count(receipt.imported, "session")
        for sid, batch in messages.items():
            if sid not in fresh:  # a session held already keeps its own turns
                receipt.count(receipt.skipped, "message", len(batch))
                continue
            for start in range(0, len(batch), _BATCH):
                await self._sessions.restore(sid, batch[start : start + _BATCH])
            receipt.count(receipt.imported, "message", len(batch))
        await self._items([i for i in items if i.id not in mids], receipt)
        receipt.count(receipt.skipped, "memory", sum(1 for i in items if i.id in mids))
        if versions and self._history is not None:
            written = await self._history.import_versions(user, versions)
            receipt.count(receipt.imported, "memory_version", written)
            receipt.count(receipt.skipped, "memory_version", len(versions) - written)
        await self._write_snapshots(user, snapshots, receipt)
        await self._propose(proposals, receipt)
        return receipt

    def _proposal(self, user: str, number: int, r: dict[str, Any]) -> Proposal:
        if self._procedures is None:
            raise _bad(number, "procedure", "procedures are not served by this sidecar")
        try:
            owner = Owner.from_tag(str(r["owner"]))
            kind, origin = Kind[str(r["kind"]).upper()], Origin[str(r["origin"]).upper()]
            ids = [str(i) for i in r.get("source_message_ids") or []]
            p = Proposal(
                owner=owner,
                procedure_id=str(r["procedure_id"]),
                content=str(r["content"]),
                kind=kind,
                title=str(r.get("title") or ""),
                reason=str(r.get("reason") or ""),
                origin=origin,
                proposed_by=str(r.get("proposed_by") or ""),
                source_session_id=str(r.get("source_session_id") or ""),
                source_message_ids=tuple(ids),
                source_user_id=user,
            )
        except (KeyError, TypeError, ValueError):
            raise _bad(
                number, "procedure", "owner, procedure_id, kind, origin or content does not parse"
            ) from None
        if kind is Kind.UNSPECIFIED or origin is Origin.UNSPECIFIED:
            raise _bad(number, "procedure", "kind and origin must be named")
        for value, name in (
            (owner.agent_id, "owner"),
            (owner.group, "owner"),
            (p.procedure_id, "procedure_id"),
            (p.proposed_by, "proposed_by"),
            (p.source_session_id, "source_session_id"),
            *((i, "source_message_ids") for i in ids),
        ):
            check_id(value, f"line {number}: {name}", required=name == "procedure_id")
        try:
            self._procedures.check(p)
        except InvalidArgument as exc:
            raise _bad(number, "procedure", str(exc)) from None
        return p

    async def _propose(self, proposals: list[Proposal], receipt: ImportReceipt) -> None:
        """Each as a proposal; one with the same content as a version held already is that version."""
        if self._procedures is None:
            return
        for p in proposals:
            _, _, created = await self._procedures.propose(p)
            receipt.count(receipt.imported if created else receipt.skipped, "procedure")

    async def _check_free(self, user: str, session_ids: list[str], memory_ids: list[str]) -> None:
        """Ids are kept, so an id another user holds here cannot be imported (ALREADY_EXISTS, before
        anything is written)."""
        for start in range(0, len(session_ids), _BATCH):
            chunk = session_ids[start : start + _BATCH]
            for sid, doc in zip(chunk, await self._sessions.get_many(chunk), strict=True):
                if doc is not None and doc.user_id != user:
                    raise AlreadyExists(f"session_id {sid!r} is taken by another user's session here")
        if self._memory is not None and memory_ids:
            for start in range(0, len(memory_ids), _BATCH):
                chunk = memory_ids[start : start + _BATCH]
                for item in await self._memory.store.fetch(filters.with_ids(chunk), limit=len(chunk)):
                    if item.user_id != user:
                        raise AlreadyExists(f"memory id {item.id!r} is taken by another user's memory here")

    def _messages(
        self, records: list[tuple[int, dict[str, Any]]], known: set[str]
    ) -> dict[str, list[Message]]:
        """The file's messages by session, each checked as AppendMessages checks a batch."""
        by_session: dict[str, list[Message]] = {}
        for number, record in records:
            m = _message(number, record)
            if m.session_id not in known:
                raise _bad(number, "message", f"session {m.session_id!r} is not a session of the file's user")
            by_session.setdefault(m.session_id, []).append(m)
        # A session holds more turns than one call may send, so its turns are checked in batches of the
        # most one call may send, by count and by bytes (and of _BATCH, the restore's round trip).
        for messages in by_session.values():
            for batch in _call_sized(messages, self._limits):
                check_batch(batch, self._limits, now_ms())
        return by_session

    def _item(self, number: int, record: dict[str, Any], user: str) -> MemoryItem:
        if self._memory is None:
            raise _bad(number, "memory", "long-term memory is off on this sidecar")
        try:
            item = from_row({**record, "metadata_json": orjson.dumps(record.get("metadata") or {}).decode()})
        except (KeyError, TypeError, ValueError) as exc:
            raise _bad(number, "memory", f"a field does not parse ({type(exc).__name__})") from None
        _check_item(item, number, user, self._limits)
        try:
            item.content = self._memory.check_content(item.content)
        except InvalidArgument as exc:
            raise _bad(number, "memory", str(exc)) from None
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

    def _versions(self, user: str, records: list[tuple[int, dict[str, Any]]]) -> list[ImportedVersion]:
        rows: list[ImportedVersion] = []
        for number, r in records:
            item = self._doc(number, "memory_version", r.get("item"), user)
            try:
                reason = ChangeReason[str(r.get("reason", "")).upper()]
                at_ms, actor, deleted = int(r["changed_at_ms"]), r.get("changed_by") or "", r.get("deleted")
            except (KeyError, TypeError, ValueError):
                raise _bad(
                    number, "memory_version", "reason, changed_at_ms or changed_by does not parse"
                ) from None
            if not isinstance(actor, str) or item.id != r.get("memory_id") or not isinstance(deleted, bool):
                raise _bad(number, "memory_version", "memory_id, changed_by or deleted is not valid")
            if not 0 <= at_ms < 2**63:
                raise _bad(number, "memory_version", "changed_at_ms is out of range")
            check_id(actor, f"line {number}: changed_by", required=False)
            rows.append((item.id, int(reason), actor, at_ms, deleted, item_bytes(item)))
        return rows

    def _snapshot(
        self, user: str, number: int, r: dict[str, Any]
    ) -> tuple[str, int, bytes, dict[str, bytes]]:
        """(snapshot id, creation ms, description, item documents by id)."""
        desc = {k: v for k, v in r.items() if k != "items"}
        sid, created = desc.get("snapshot_id"), desc.get("created_at_ms")
        if not isinstance(sid, str) or not isinstance(created, int) or isinstance(created, bool):
            raise _bad(number, "memory_snapshot", "snapshot_id or created_at_ms is not valid")
        if not 0 <= created < 2**63 or desc.get("user_id") != user:
            raise _bad(number, "memory_snapshot", "created_at_ms or user_id is not valid")
        check_id(sid, f"line {number}: snapshot_id")
        docs = r.get("items")
        if not isinstance(docs, list):
            raise _bad(number, "memory_snapshot", "items is not a list")
        items = {i.id: item_bytes(i) for i in (self._doc(number, "memory_snapshot", d, user) for d in docs)}
        return sid, created, orjson.dumps(desc), items

    async def _write_snapshots(
        self, user: str, snapshots: list[tuple[str, int, bytes, dict[str, bytes]]], receipt: ImportReceipt
    ) -> None:
        if not snapshots or self._history is None:
            return
        backend = self._history.snapshots
        for sid, created, desc, items in snapshots:
            try:
                await backend.reserve(user, sid, created)
            except AlreadyExists:
                receipt.count(receipt.skipped, "memory_snapshot")
                continue
            await backend.write(user, sid, desc, items)
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
