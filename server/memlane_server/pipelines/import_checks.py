"""The checks of an export file's records that need no store (ImportUserData reads the file through
them before it writes anything; ``user_import`` adds the checks against what is held here).

Every record is hostile input. Each passes the checks of the RPC that first wrote it (the id grammar,
the bounds of a message, the content rules of memory), with its ids put in NFC first exactly as the API
boundary puts request fields (``ids.normalized``): a file cannot store data under a form of an id that
no request can name, and so no erasure would find. On top of that the file is checked as a whole: an
id twice in the file (a session, a memory, a snapshot, a message, or a seq twice in one session) is
refused, since writing it would leave two rows under one id or two turns at one seq, and a session's
``last_seq`` is raised to its last turn so the next append does not reuse a seq. Every integer fits what
the stores hold exactly (``MAX_INT``), every snapshot description has exactly the fields a snapshot is
read back with. A failure names the line and field: ``line 7 (message): seq ...``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..errors import InvalidArgument
from ..ids import id_problem, normalized
from ..ltm.history import ChangeReason, ImportedVersion, item_bytes
from ..ltm.model import MemoryItem
from ..ltm.schema import from_row
from ..sessions.codec import decode_session
from ..sessions.limits import (
    Limits,
    check_batch,
    check_list,
    check_metadata,
    check_short,
    message_bytes,
)
from ..sessions.model import Message, Role, Session, VisibilityKind
from ..sessions.store import now_ms
from .user_data import ExportFile

NOT_RESTORED = ("trace", "checkpoint")  # and every "archive.<dataset>"
KINDS = ("session", "message", "memory", "memory_version", "memory_snapshot", "procedure")
# The largest integer a file may hold: Redis scores and Lua numbers are doubles, exact up to 2**53.
MAX_INT = 2**53 - 1
_BATCH = 500  # messages restored per Redis round trip
# Fields of a record (and of the items that versions and snapshots carry) that hold ids: the names of
# the API's id fields (api/interceptor.py ID_FIELDS), and the export's own names for ids.
ID_FIELDS = frozenset(
    {
        *("user_id", "agent_id", "session_id", "memory_id", "message_id", "source_agent_id"),
        *("source_session_id", "group", "visibility_group", "channel", "procedure_id", "snapshot_id"),
        *("id", "superseded_by", "proposed_by", "changed_by", "source_user_id", "owner"),
    }
)
ID_LISTS = frozenset({"participants", "source_message_ids", "groups"})
SESSION_FIELDS = frozenset({"session_id", "source_session_id"})
SNAPSHOT_FIELDS = ("snapshot_id", "user_id", "agent_id", "groups", "created_at_ms", "item_count", "note")
MAX_NOTE_CHARS = 1000


def bad(number: int, kind: str, why: str) -> InvalidArgument:
    return InvalidArgument(f"line {number} ({kind}): {why}", field="data")


def nfc(record: dict[str, Any]) -> dict[str, Any]:
    """The record with its id fields in NFC (other values as they are: text is the user's own)."""
    out = dict(record)
    for name, value in record.items():
        if name in ID_FIELDS and isinstance(value, str):
            out[name] = normalized(value)
        elif name in ID_LISTS and isinstance(value, list):
            out[name] = [normalized(v) if isinstance(v, str) else v for v in value]
    return out


def check_id(value: object, number: int, kind: str, name: str, *, required: bool = True) -> None:
    if not isinstance(value, str):
        raise bad(number, kind, f"{name} is not a string")
    if not value:
        if required:
            raise bad(number, kind, f"{name} is required")
        return
    problem = id_problem(value, session=name.split("[", 1)[0] in SESSION_FIELDS)
    if problem:
        raise bad(number, kind, f"{name} {value[:64]!r} is not a valid id: it {problem}")


def check_int(value: object, number: int, kind: str, name: str, *, least: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not least <= value <= MAX_INT:
        raise bad(number, kind, f"{name} is not an integer from {least} to {MAX_INT}")
    return value


@dataclass(slots=True)
class Snapshot:
    snapshot_id: str
    created_at_ms: int
    meta: bytes  # the description, rebuilt from its checked fields
    items: dict[str, bytes]


@dataclass(slots=True)
class CheckedFile:
    """The file's records, each checked and in NFC, grouped by what they are."""

    user_id: str
    sessions: list[Session] = field(default_factory=list)
    messages: dict[str, list[Message]] = field(default_factory=dict)
    message_lines: dict[str, int] = field(default_factory=dict)  # session id: the line of its first turn
    items: list[MemoryItem] = field(default_factory=list)
    versions: list[ImportedVersion] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    procedures: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    not_restored: dict[str, int] = field(default_factory=dict)
    # Memory ids the file names (items, versions, snapshots' items), with the first line naming each.
    memory_ids: dict[str, int] = field(default_factory=dict)
    session_lines: dict[str, int] = field(default_factory=dict)
    # Sessions messages name that the file holds no record of, with the first line naming each.
    other_sessions: dict[str, int] = field(default_factory=dict)


def check_file(file: ExportFile, limits: Limits, *, memory: bool, history: bool) -> CheckedFile:
    """Every record checked on its own and against the others; raises InvalidArgument naming the line
    (or ResourceExhausted for a message over the configured limits, as AppendMessages answers)."""
    user = file.user_id
    out = CheckedFile(user)
    messages: list[tuple[int, dict[str, Any]]] = []
    snapshot_ids: dict[str, int] = {}
    item_lines: dict[str, int] = {}
    for number, kind, raw in file.records:
        if kind in NOT_RESTORED or kind.startswith("archive."):
            out.not_restored[kind] = out.not_restored.get(kind, 0) + 1
            continue
        if kind not in KINDS:
            raise bad(number, kind, "not a record type of this format")
        record = nfc(raw)
        if record.get("user_id", user) != user:
            raise bad(number, kind, "belongs to another user than the header's")
        if kind == "session":
            s = _session(number, record, user, limits)
            _first(out.session_lines, s.session_id, number, kind, "session_id")
            out.sessions.append(s)
        elif kind == "message":
            messages.append((number, record))
        elif kind == "memory":
            if not memory:
                raise bad(number, kind, "long-term memory is off on this sidecar")
            item = _item(number, kind, record, user, limits)
            _first(item_lines, item.id, number, kind, "id")
            out.memory_ids.setdefault(item.id, number)
            out.items.append(item)
        elif kind == "memory_version":
            if history:
                out.versions.append(_version(number, record, user, limits, out.memory_ids))
        elif kind == "memory_snapshot":
            if history:
                snap = _snapshot(number, record, user, limits, out.memory_ids)
                _first(snapshot_ids, snap.snapshot_id, number, kind, "snapshot_id")
                out.snapshots.append(snap)
        else:
            out.procedures.append((number, record))
    out.messages = _messages(messages, out, limits)
    return out


def _first(seen: dict[str, int], key: str, number: int, kind: str, name: str) -> None:
    if key in seen:
        raise bad(number, kind, f"{name} {key!r} appears twice in the file (first on line {seen[key]})")
    seen[key] = number


def _session(number: int, record: dict[str, Any], user: str, limits: Limits) -> Session:
    kind = "session"
    for name, value in record.items():
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise bad(number, kind, f"{name}: every field of a session document is a string or an integer")
        if isinstance(value, int):
            check_int(value, number, kind, str(name))
    check_id(record.get("session_id"), number, kind, "session_id")
    try:
        s = decode_session({str(k).encode(): str(v).encode() for k, v in record.items()})
    except (KeyError, TypeError, ValueError, orjson.JSONDecodeError) as exc:
        raise bad(number, kind, f"a field does not parse ({type(exc).__name__})") from None
    if s.user_id != user:
        raise bad(number, kind, "belongs to another user than the header's")
    if not (_strings(s.participants) and _strings(s.tags) and _string_map(s.metadata)):
        raise bad(number, kind, "participants, tags or metadata is not valid")
    s.participants = [normalized(p) for p in s.participants]
    check_id(s.agent_id, number, kind, "agent_id", required=False)
    with _at(number, kind):
        # What CreateSession checks, before the first write rather than at the session's own.
        for name in ("channel", "group", "model"):
            check_short(getattr(s, name), name, limits)
        check_metadata(s.metadata, "metadata", limits)
        check_list(s.participants, "participants", limits)
        check_list(s.tags, "tags", limits)
    return s


class _at:
    """Re-raises a check's InvalidArgument naming the record's line."""

    def __init__(self, number: int, kind: str) -> None:
        self.number, self.kind = number, kind

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, InvalidArgument):
            raise bad(self.number, self.kind, str(exc)) from None


_ROLES = {r.name.lower(): r for r in Role}
_VISIBILITIES = {v.name.lower(): v for v in VisibilityKind}
_MESSAGE_TEXTS = (
    *("message_id", "session_id", "content", "source_agent_id", "participant_name", "user_id"),
    *("channel", "native_format", "native_json", "visibility_group"),
)
_MESSAGE_IDS = ("source_agent_id", "user_id", "channel", "visibility_group")


def _message(number: int, record: dict[str, Any]) -> Message:
    kind = "message"
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
        raise bad(number, kind, f"a field does not parse ({type(exc).__name__})") from None
    for name in _MESSAGE_TEXTS:
        if not isinstance(getattr(m, name), str):
            raise bad(number, kind, f"{name} is not a string")
    if not (
        all(_strings(v) for v in (m.planning_steps, m.invoked, m.tool_call_ids))
        and _string_map(m.metadata)
        and isinstance(m.transient, bool)
    ):
        raise bad(number, kind, "planning_steps, invoked, tool_call_ids, metadata or transient is not valid")
    check_int(m.seq, number, kind, "seq", least=1)
    check_int(m.created_at_ms, number, kind, "created_at_ms")
    check_int(m.token_count, number, kind, "token_count")
    check_id(m.message_id, number, kind, "message_id")
    check_id(m.session_id, number, kind, "session_id")
    for name in _MESSAGE_IDS:
        check_id(getattr(m, name), number, kind, name, required=False)
    return m


def _messages(
    records: list[tuple[int, dict[str, Any]]], out: CheckedFile, limits: Limits
) -> dict[str, list[Message]]:
    """The file's messages by session, each checked as AppendMessages checks a batch, no id or seq twice
    in a session, and each session's ``last_seq`` at its last turn at least."""
    by_session: dict[str, list[tuple[int, Message]]] = {}
    ids: dict[tuple[str, str], int] = {}
    seqs: dict[tuple[str, str], int] = {}
    for number, record in records:
        m = _message(number, record)
        if m.session_id not in out.session_lines:
            # Held here already, or no session of the user: ``user_import`` reads which.
            out.other_sessions.setdefault(m.session_id, number)
        for seen, key, what in (
            (ids, (m.session_id, m.message_id), f"message_id {m.message_id!r}"),
            (seqs, (m.session_id, str(m.seq)), f"seq {m.seq}"),
        ):
            if key in seen:
                raise bad(
                    number, "message", f"{what} appears twice in the session (first on line {seen[key]})"
                )
            seen[key] = number
        by_session.setdefault(m.session_id, []).append((number, m))
    # A session holds more turns than one call may send, so its turns are checked in batches of the
    # most one call may send, by count and by bytes.
    for turns in by_session.values():
        for batch in _call_sized(turns, limits):
            try:
                check_batch([m for _, m in batch], limits, now_ms())
            except InvalidArgument as exc:
                # The field names the message in the batch (``messages[3].content``): its line.
                index, _, _ = (exc.field or "").removeprefix("messages[").partition("]")
                at = int(index) if index.isdigit() and int(index) < len(batch) else 0
                raise bad(batch[at][0], "message", str(exc)) from None
    for s in out.sessions:
        turns = by_session.get(s.session_id, [])
        if turns:
            out.message_lines[s.session_id] = turns[0][0]
            s.last_seq = max(s.last_seq, *(m.seq for _, m in turns))
            s.message_count = max(s.message_count, len(turns))
    return {sid: [m for _, m in turns] for sid, turns in by_session.items()}


def _call_sized(turns: list[tuple[int, Message]], limits: Limits) -> Iterator[list[tuple[int, Message]]]:
    """``turns`` in order, cut where one AppendMessages call would stop: at the batch's message count
    or its bytes. A message over the bytes alone is a batch of its own (and ``check_batch`` refuses it,
    as AppendMessages would)."""
    size = min(_BATCH, limits.max_batch_messages)
    batch: list[tuple[int, Message]] = []
    total = 0
    for number, m in turns:
        cost = message_bytes(m)
        if batch and (len(batch) == size or total + cost > limits.max_batch_bytes):
            yield batch
            batch, total = [], 0
        batch.append((number, m))
        total += cost
    if batch:
        yield batch


def _item(number: int, kind: str, doc: object, user: str, limits: Limits) -> MemoryItem:
    """A memory item: a ``memory`` record, or the item a version or snapshot carries (stored columns)."""
    if not isinstance(doc, dict):
        raise bad(number, kind, "item is not an object")
    doc = nfc(doc)
    if "metadata" in doc and "metadata_json" not in doc:
        doc["metadata_json"] = orjson.dumps(doc.get("metadata") or {}).decode()
    for name in ("usage_count", "useful_count", "wrong_count", "last_used_at_ms", "created_at_ms"):
        if doc.get(name) is not None:
            check_int(doc[name], number, kind, name)
    for name in ("updated_at_ms", "occurred_at_ms", "valid_until_ms"):
        if doc.get(name) is not None:
            check_int(doc[name], number, kind, name)
    try:
        item = from_row(doc)
    except (KeyError, TypeError, ValueError, orjson.JSONDecodeError) as exc:
        raise bad(number, kind, f"a field does not parse ({type(exc).__name__})") from None
    if item.user_id != user:
        raise bad(number, kind, "belongs to another user than the header's")
    texts = (item.id, item.agent_id, item.group, item.channel, item.superseded_by, item.source_session_id)
    if not (
        all(isinstance(t, str) for t in (*texts, item.content, item.slot))
        and _strings(item.keywords)
        and _strings(item.source_message_ids)
        and _string_map(item.metadata)
        and 0.0 <= item.importance <= 1.0
    ):
        raise bad(number, kind, "a field has the wrong type, or importance is outside [0, 1]")
    check_id(item.id, number, kind, "id")
    for name in ("agent_id", "group", "channel", "superseded_by", "source_session_id"):
        check_id(getattr(item, name), number, kind, name, required=False)
    with _at(number, kind):
        check_list(item.keywords, "keywords", limits)
        check_list(item.source_message_ids, "source_message_ids", limits)
        check_metadata(item.metadata, "metadata", limits)
    for i, mid in enumerate(item.source_message_ids):
        check_id(mid, number, kind, f"source_message_ids[{i}]")
    return item


def _version(
    number: int, r: dict[str, Any], user: str, limits: Limits, memory_ids: dict[str, int]
) -> ImportedVersion:
    kind = "memory_version"
    item = _item(number, kind, r.get("item"), user, limits)
    try:
        reason = ChangeReason[str(r.get("reason", "")).upper()]
    except KeyError:
        raise bad(number, kind, "reason is not a change reason of this format") from None
    at_ms = check_int(r.get("changed_at_ms"), number, kind, "changed_at_ms")
    actor, deleted = r.get("changed_by") or "", r.get("deleted")
    if item.id != r.get("memory_id"):
        raise bad(number, kind, "memory_id is not the id of the item it carries")
    if not isinstance(deleted, bool):
        raise bad(number, kind, "deleted is not true or false")
    check_id(actor, number, kind, "changed_by", required=False)
    memory_ids.setdefault(item.id, number)
    return (item.id, int(reason), actor, at_ms, deleted, item_bytes(item))


def _snapshot(
    number: int, r: dict[str, Any], user: str, limits: Limits, memory_ids: dict[str, int]
) -> Snapshot:
    """A snapshot with exactly the description fields it is read back with (``SnapshotInfo``): a
    field more or of another type would fail every later snapshot call of the user."""
    kind = "memory_snapshot"
    desc = {k: v for k, v in r.items() if k != "items"}
    for name in desc:
        if name not in SNAPSHOT_FIELDS:
            raise bad(number, kind, f"{name} is not a field of a snapshot")
    sid = desc.get("snapshot_id")
    check_id(sid, number, kind, "snapshot_id")
    assert isinstance(sid, str)
    created = check_int(desc.get("created_at_ms"), number, kind, "created_at_ms")
    if desc.get("user_id") != user:
        raise bad(number, kind, "user_id is not the header's")
    agent = desc.get("agent_id", "")
    check_id(agent, number, kind, "agent_id", required=False)
    groups = desc.get("groups", [])
    if not _strings(groups):
        raise bad(number, kind, "groups is not a list of strings")
    for i, g in enumerate(groups):
        check_id(g, number, kind, f"groups[{i}]")
    note = desc.get("note", "")
    if not isinstance(note, str) or len(note) > MAX_NOTE_CHARS:
        raise bad(number, kind, f"note is not a string of at most {MAX_NOTE_CHARS} characters")
    docs = r.get("items")
    if not isinstance(docs, list):
        raise bad(number, kind, "items is not a list")
    items: dict[str, bytes] = {}
    for doc in docs:
        item = _item(number, kind, doc, user, limits)
        if item.id in items:
            raise bad(number, kind, f"item {item.id!r} appears twice in the snapshot")
        memory_ids.setdefault(item.id, number)
        items[item.id] = item_bytes(item)
    if "item_count" in desc:
        check_int(desc["item_count"], number, kind, "item_count")
    meta = {
        "snapshot_id": sid,
        "user_id": user,
        "agent_id": agent,
        "groups": sorted(set(groups)),
        "created_at_ms": created,
        "item_count": len(items),
        "note": note,
    }
    return Snapshot(sid, created, orjson.dumps(meta), items)


def _strings(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _string_map(value: object) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    )
