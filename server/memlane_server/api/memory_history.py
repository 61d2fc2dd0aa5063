"""MemoryService's versions and snapshots RPCs (a mixin of ``MemoryServicer``): the same caller rules as
the rest of the memory API (``api/memory._who``): an agent sees and changes what it may read."""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc

from memlane.v1 import memory_pb2 as mpb

from .. import linear_regex
from ..embedding.admission import EmbeddingAdmission
from ..errors import InvalidArgument, Unavailable
from ..extraction import Extractor
from ..ids import check_id
from ..ltm import MemoryService, Visibility
from ..ltm.history import MemoryVersion
from ..ltm.operations import Diff, MemorySnapshots, SnapshotInfo
from ..ltm.redis_state import OnceMarks
from ..ltm.service import readable
from ..paging import (
    cursor_of,
    decode_token,
    encode_token,
    malformed_token,
    page_size,
    query_fingerprint,
    stale_token,
)
from ..sessions.limits import Limits
from .enums import CHANGE_REASON, DIFF_KIND
from .memory import MemoryServicer, memory_to_pb
from .memory import _who as who_of

_Ctx: TypeAlias = grpc.aio.ServicerContext
MAX_VERSION_PAGE = 500
MAX_SNAPSHOT_PAGE = 100


def _query(listing: str, who: Visibility, *parts: str) -> str:
    return query_fingerprint(listing, who.user_id, who.agent_id, sorted(set(who.groups)), *parts)


_STREAM_ID = linear_regex.compile(r"[0-9]{1,20}-[0-9]{1,20}")


def _stream_cursor(cursor: list[Any] | None) -> str:
    """The stream entry id a versions page token resumes after ("" for the first page): it reaches
    Redis as a range bound, so it must be one."""
    if cursor is None:
        return ""
    entry_id = str(cursor_of(cursor, str)[0])
    if not _STREAM_ID.fullmatch(entry_id):
        raise malformed_token()
    return entry_id


def _snapshot_pb(s: SnapshotInfo) -> mpb.MemorySnapshot:
    return mpb.MemorySnapshot(
        snapshot_id=s.snapshot_id,
        user_id=s.user_id,
        agent_id=s.agent_id,
        groups=s.groups,
        created_at_unix_ms=s.created_at_ms,
        item_count=s.item_count,
        note=s.note,
    )


def _diff_pb(d: Diff) -> mpb.MemoryDiff:
    out = mpb.MemoryDiff(memory_id=d.memory_id, kind=DIFF_KIND.to_pb(d.kind))
    if d.before is not None:
        out.before.CopyFrom(memory_to_pb(d.before))
    if d.after is not None:
        out.after.CopyFrom(memory_to_pb(d.after))
    return out


def _version_pb(v: MemoryVersion) -> mpb.MemoryVersion:
    return mpb.MemoryVersion(
        memory_id=v.memory_id,
        reason=CHANGE_REASON.to_pb(v.reason),
        changed_by=v.changed_by,
        changed_at_unix_ms=v.changed_at_ms,
        memory=memory_to_pb(v.item),
        deleted=v.deleted,
    )


class MemoryHistoryMixin:
    _memory: MemoryService
    _snapshots: MemorySnapshots | None

    def _snaps(self) -> MemorySnapshots:
        if self._snapshots is None:
            raise Unavailable("memory snapshots are not configured on this sidecar")
        return self._snapshots

    async def ListMemoryVersions(
        self, request: mpb.ListMemoryVersionsRequest, context: _Ctx
    ) -> mpb.ListMemoryVersionsResponse:
        who = who_of(request.caller)
        size = page_size(request.page_size, default=50, maximum=MAX_VERSION_PAGE)
        query = _query("memory-versions", who, request.memory_id)
        after = _stream_cursor(decode_token(request.page_token, query))
        history = self._memory.history
        if history is None:
            raise Unavailable("memory versions are not kept on this sidecar")
        allowed = await self._readable_ids(who, request.memory_id)
        out: list[MemoryVersion] = []
        while True:
            page, after = await history.versions(who.user_id, request.memory_id, after, size - len(out))
            # Versions of items the caller cannot read now are left out (deleted items: whole-user view).
            out += [v for v in page if allowed is None or v.memory_id in allowed]
            if len(out) >= size or not after:
                break
        token = encode_token(query, [after]) if after else ""
        return mpb.ListMemoryVersionsResponse(versions=[_version_pb(v) for v in out], next_page_token=token)

    async def _readable_ids(self, who: Visibility, memory_id: str) -> set[str] | None:
        """The ids whose versions the caller may read (None: every id, the whole-user view)."""
        if memory_id:
            check_id(memory_id, "memory_id")
        if not who.agent_id:
            return None
        if memory_id:
            await self._memory.get(who, memory_id)  # NOT_FOUND unless readable now
            return {memory_id}
        page = await self._memory.store.fetch_columns(readable(who), ["id"])
        return {str(i) for i in page["id"].to_pylist()}

    async def CreateMemorySnapshot(
        self, request: mpb.CreateMemorySnapshotRequest, context: _Ctx
    ) -> mpb.CreateMemorySnapshotResponse:
        who = who_of(request.caller)
        check_id(request.snapshot_id, "snapshot_id")
        if len(request.note) > 1000:
            raise InvalidArgument("note is longer than 1000 characters")
        info = await self._snaps().take(who, request.snapshot_id, request.note)
        return mpb.CreateMemorySnapshotResponse(snapshot=_snapshot_pb(info))

    async def ListMemorySnapshots(
        self, request: mpb.ListMemorySnapshotsRequest, context: _Ctx
    ) -> mpb.ListMemorySnapshotsResponse:
        who = who_of(request.caller)
        size = page_size(request.page_size, default=20, maximum=MAX_SNAPSHOT_PAGE)
        query = _query("memory-snapshots", who)
        cursor = decode_token(request.page_token, query)
        infos = await self._snaps().list_snapshots(who)
        start = 0
        if cursor is not None:
            (last,) = cursor_of(cursor, str)
            ids = [s.snapshot_id for s in infos]
            if last not in ids:  # deleted since: the listing cannot say where it stood
                raise stale_token("a snapshot")
            start = ids.index(last) + 1
        page = infos[start : start + size]
        more = start + size < len(infos)
        return mpb.ListMemorySnapshotsResponse(
            snapshots=[_snapshot_pb(s) for s in page],
            next_page_token=encode_token(query, [page[-1].snapshot_id]) if more else "",
        )

    async def GetMemorySnapshotDiff(
        self, request: mpb.GetMemorySnapshotDiffRequest, context: _Ctx
    ) -> mpb.GetMemorySnapshotDiffResponse:
        who = who_of(request.caller)
        check_id(request.snapshot_id, "snapshot_id")
        info, diffs = await self._snaps().diff(who, request.snapshot_id)
        return mpb.GetMemorySnapshotDiffResponse(
            snapshot=_snapshot_pb(info), diffs=[_diff_pb(d) for d in diffs]
        )

    async def RestoreMemorySnapshot(
        self, request: mpb.RestoreMemorySnapshotRequest, context: _Ctx
    ) -> mpb.RestoreMemorySnapshotResponse:
        who = who_of(request.caller, write=True)
        check_id(request.snapshot_id, "snapshot_id")
        snaps = self._snaps()
        await snaps.diff(who, request.snapshot_id)  # NOT_FOUND / PERMISSION_DENIED before any backup
        response = mpb.RestoreMemorySnapshotResponse()
        if request.backup_snapshot_id:
            check_id(request.backup_snapshot_id, "backup_snapshot_id")
            backup = await snaps.take(
                who, request.backup_snapshot_id, f"before restoring {request.snapshot_id}"
            )
            response.backup.CopyFrom(_snapshot_pb(backup))
        diffs = await snaps.restore(who, request.snapshot_id)
        response.diffs.extend(_diff_pb(d) for d in diffs)
        return response

    async def DeleteMemorySnapshot(
        self, request: mpb.DeleteMemorySnapshotRequest, context: _Ctx
    ) -> mpb.DeleteMemorySnapshotResponse:
        who = who_of(request.caller, write=True)
        check_id(request.snapshot_id, "snapshot_id")
        await self._snaps().delete(who, request.snapshot_id)
        return mpb.DeleteMemorySnapshotResponse()


class MemoryServicerWithHistory(MemoryHistoryMixin, MemoryServicer):
    """The memory API with versions and snapshots (kept apart from api/memory.py, which stays the CRUD)."""

    def __init__(
        self,
        memory: MemoryService,
        extractor: Extractor,
        feedback_marks: OnceMarks,
        admission: EmbeddingAdmission,
        snapshots: MemorySnapshots | None,
        *,
        limits: Limits,
    ) -> None:
        super().__init__(memory, extractor, feedback_marks, admission, limits=limits)
        self._snapshots = snapshots
