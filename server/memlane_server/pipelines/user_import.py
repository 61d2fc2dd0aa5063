"""Restoring a user from an export file (ImportUserData): the inverse of ``UserData.export``.

What is written back: sessions (their documents as they were: status, times, summary), their messages
(ids, seqs and times kept), long-term memory items (ids, provenance, times and state kept; vectors made
again by this sidecar's model, so a file from a sidecar with another model still recalls right), the
items' version history at the times it was made, snapshots, and the procedure versions learned from
the user's sessions: each as a proposal of its agent or group (``ProcedureService.propose``, so the PII
rule and the approval policy of this sidecar apply: a version the extractor wrote always waits for an
operator, and no version comes back active on its old approval). What is not: turn traces (a record of
what one assembly saw, not memory), framework checkpoints and archived rows (kept by the archive's own
retention); they are counted in ``not_restored``.

The whole file is checked before anything is written: each record on its own and against the others
(``import_checks``), then against what this sidecar holds: an id another user holds here is refused
(ALREADY_EXISTS), and a procedure version may name as its origin only what the importing caller could
propose as (``Importer.origin_for``). One failure refuses the file and writes nothing. Ids are kept,
and a record whose id is held already is left as it is: importing the same file twice writes nothing
the second time. A file too large for one call arrives in parts (``sessions.import_parts``) and is
imported the same way once its last part is in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from ..errors import AlreadyExists, InvalidArgument, PermissionDenied, ResourceExhausted
from ..ltm import MemoryService
from ..ltm.history import MemoryHistory
from ..ltm.ingest import embedding_text
from ..ltm.model import MemoryItem
from ..procedures.service import MAX_PER_OWNER, MAX_VERSIONS, ProcedureService, Proposal
from ..procedures.store import Kind, Origin, Owner
from ..sessions.import_parts import ImportParts
from ..sessions.limits import Limits
from ..sessions.store import SessionStore
from .import_checks import CheckedFile, Snapshot, bad, check_file, check_id
from .user_data import ExportFile

_BATCH = 500  # messages restored per Redis round trip, items embedded per call, ids read per query


@dataclass(frozen=True, slots=True)
class Importer:
    """Who imports: its agent id, and the origin it may propose a procedure of an owner as (raises
    PermissionDenied when it may not propose for that owner at all; ``api/procedures.py``'s rule)."""

    agent_id: str
    origin_for: Callable[[Owner], Origin]


@dataclass(slots=True)
class ImportReceipt:
    user_id: str
    imported: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    not_restored: dict[str, int] = field(default_factory=dict)

    def count(self, into: dict[str, int], kind: str, n: int = 1) -> None:
        if n:
            into[kind] = into.get(kind, 0) + n


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
        self.parts = ImportParts(sessions.redis, sessions.keys)

    async def held(self, user_id: str) -> tuple[set[str], set[str]]:
        """The user's session ids and memory ids held here."""
        sids = set(await self._sessions.session_ids_of_user(user_id))
        mids: set[str] = set()
        if self._memory is not None:
            mids = {i.id for i in await self._memory.export_user(user_id)}
        return sids, mids

    async def run(self, file: ExportFile, *, merge: bool, importer: Importer) -> ImportReceipt:
        """Checks every record first, then writes: a file with one bad line writes nothing."""
        user = file.user_id
        checked = check_file(
            file, self._limits, memory=self._memory is not None, history=self._history is not None
        )
        receipt = ImportReceipt(user, not_restored=checked.not_restored)
        items = [self._content(checked, i) for i in checked.items]
        proposals = [self._proposal(user, n, r, importer) for n, r in checked.procedures]
        await self._check_free(checked)
        sids, mids = await self.held(user)
        for sid, line in checked.other_sessions.items():
            if sid not in sids:
                raise bad(line, "message", f"session {sid!r} is not a session of the file's user")
        file_sids = {s.session_id for s in checked.sessions}
        if (sids or mids) and not merge:
            if file_sids <= sids and {i.id for i in items} <= mids:
                merge = True  # the same file again: every record is held, nothing will be written
            else:
                raise AlreadyExists(
                    f"user {user!r} already has data on this sidecar; import with merge"
                    " (memlane import-user --merge) to add the file's records to it"
                )
        await self._check_room(user, checked.snapshots)
        await self._check_procedure_room(proposals)
        # Writes, in the order the data hangs together: sessions, their turns, items, their history.
        fresh: set[str] = set()
        for s in checked.sessions:
            if s.session_id in sids or not await self._sessions.import_session(s):
                receipt.count(receipt.skipped, "session")
            else:
                fresh.add(s.session_id)
                receipt.count(receipt.imported, "session")
        for sid, batch in checked.messages.items():
            if sid not in fresh:  # a session held already keeps its own turns
                receipt.count(receipt.skipped, "message", len(batch))
                continue
            for start in range(0, len(batch), _BATCH):
                await self._sessions.restore(sid, batch[start : start + _BATCH])
            receipt.count(receipt.imported, "message", len(batch))
        await self._items([i for i in items if i.id not in mids], receipt)
        receipt.count(receipt.skipped, "memory", sum(1 for i in items if i.id in mids))
        if checked.versions and self._history is not None:
            written = await self._history.import_versions(user, checked.versions)
            receipt.count(receipt.imported, "memory_version", written)
            receipt.count(receipt.skipped, "memory_version", len(checked.versions) - written)
        await self._write_snapshots(user, checked.snapshots, receipt)
        await self._propose(proposals, receipt)
        return receipt

    def _content(self, checked: CheckedFile, item: MemoryItem) -> MemoryItem:
        """The content rules of CreateMemory (personal data, size), before anything is written."""
        assert self._memory is not None  # check_file refuses memory records when it is off
        try:
            item.content = self._memory.check_content(item.content)
        except InvalidArgument as exc:
            raise bad(checked.memory_ids.get(item.id, 0), "memory", f"content: {exc}") from None
        return item

    def _proposal(self, user: str, number: int, r: dict[str, Any], importer: Importer) -> Proposal:
        kind_name = "procedure"
        if self._procedures is None:
            raise bad(number, kind_name, "procedures are not served by this sidecar")
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
            raise bad(
                number, kind_name, "owner, procedure_id, kind, origin or content does not parse"
            ) from None
        if kind is Kind.UNSPECIFIED or origin is Origin.UNSPECIFIED:
            raise bad(number, kind_name, "kind and origin must be named")
        for value, name in (
            (owner.agent_id, "owner"),
            (owner.group, "owner"),
            (p.procedure_id, "procedure_id"),
            (p.proposed_by, "proposed_by"),
            (p.source_session_id, "source_session_id"),
            *((i, "source_message_ids") for i in ids),
        ):
            check_id(value, number, kind_name, name, required=name == "procedure_id")
        try:
            allowed = importer.origin_for(owner)
        except PermissionDenied as exc:
            raise bad(number, kind_name, f"owner: {exc}") from None
        # A version is proposed under the origin it names, and with `procedure_approval: auto` an
        # agent's or operator's proposal goes live in every user's context: so a file may name only
        # what its importer is. The extractor's versions always wait for an operator, whoever imports.
        if origin is not Origin.EXTRACTOR and (origin is not allowed or p.proposed_by != importer.agent_id):
            raise bad(
                number,
                kind_name,
                f"origin: {origin.name.lower()} by {p.proposed_by!r} is not the importing caller"
                f" ({allowed.name.lower()} {importer.agent_id!r}); a file names only its importer"
                " or the extractor as a procedure's proposer",
            )
        try:
            return replace(p, content=self._procedures.check(p))  # the content propose will compare
        except InvalidArgument as exc:
            raise bad(number, kind_name, str(exc)) from None

    async def _propose(self, proposals: list[Proposal], receipt: ImportReceipt) -> None:
        """Each as a proposal; one with the same content as a version held already is that version."""
        if self._procedures is None:
            return
        for p in proposals:
            _, _, created = await self._procedures.propose(p)
            receipt.count(receipt.imported if created else receipt.skipped, "procedure")

    async def _check_free(self, checked: CheckedFile) -> None:
        """Ids are kept, so an id another user holds here cannot be imported (ALREADY_EXISTS, before
        anything is written): sessions, and memory ids wherever the file names them (items, versions,
        snapshots), since a snapshot restored later writes its items back under their ids."""
        user = checked.user_id
        session_ids = list(checked.session_lines)
        for start in range(0, len(session_ids), _BATCH):
            chunk = session_ids[start : start + _BATCH]
            for sid, doc in zip(chunk, await self._sessions.get_many(chunk), strict=True):
                if doc is not None and doc.user_id != user:
                    line = checked.session_lines[sid]
                    raise AlreadyExists(
                        f"line {line} (session): session_id {sid!r} is taken by another user's session here"
                    )
        if self._memory is None or not checked.memory_ids:
            return
        taken = await self._memory.store.held_by_others(user, list(checked.memory_ids))
        if taken:
            # The importer is an operator, who may list every user: naming the clash is no oracle here.
            first = min(taken, key=lambda i: checked.memory_ids[i])
            line = checked.memory_ids[first]
            raise AlreadyExists(f"line {line}: memory id {first!r} is taken by another user's memory here")

    async def _check_room(self, user: str, snapshots: list[Snapshot]) -> None:
        """The file's new snapshots fit the user's snapshot limit (else ``reserve`` would refuse one
        after the writes before it)."""
        if not snapshots or self._history is None:
            return
        backend = self._history.snapshots
        held = {orjson.loads(m)["snapshot_id"] for m in await backend.metas(user)}
        new = [s for s in snapshots if s.snapshot_id not in held]
        if len(held) + len(new) > backend.max_snapshots:
            raise ResourceExhausted(
                f"the file holds {len(new)} new snapshots and the user {len(held)}; a user holds at most"
                f" {backend.max_snapshots}: delete some first",
                field="data",
            )

    async def _check_procedure_room(self, proposals: list[Proposal]) -> None:
        """The file's new procedures and versions fit each owner's limits (else ``propose`` would refuse
        one after the writes before it)."""
        if not proposals or self._procedures is None:
            return
        store = self._procedures.store
        by_procedure: dict[tuple[Owner, str], set[tuple[str, Kind]]] = {}
        for p in proposals:
            by_procedure.setdefault((p.owner, p.procedure_id), set()).add((p.content, p.kind))
        new_procedures: dict[Owner, int] = {}
        for (owner, procedure_id), versions in by_procedure.items():
            proc, _ = await store.read(owner, procedure_id)
            if proc is None:
                new_procedures[owner] = new_procedures.get(owner, 0) + 1
            held = {(v.content, v.kind) for v in proc.versions} if proc is not None else set()
            if len(held) + len(versions - held) > MAX_VERSIONS:
                raise ResourceExhausted(
                    f"procedure {procedure_id!r} would have more than {MAX_VERSIONS} versions", field="data"
                )
        for owner, n in new_procedures.items():
            if await store.count(owner) + n > MAX_PER_OWNER:
                raise ResourceExhausted(
                    f"owner {owner.tag!r} would have more than {MAX_PER_OWNER} procedures", field="data"
                )

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

    async def _write_snapshots(self, user: str, snapshots: list[Snapshot], receipt: ImportReceipt) -> None:
        if not snapshots or self._history is None:
            return
        backend = self._history.snapshots
        for snap in snapshots:
            try:
                await backend.reserve(user, snap.snapshot_id, snap.created_at_ms)
            except AlreadyExists:
                receipt.count(receipt.skipped, "memory_snapshot")
                continue
            await backend.write(user, snap.snapshot_id, snap.meta, snap.items)
            receipt.count(receipt.imported, "memory_snapshot")
