"""AdminService: per-user export, import and erasure, the user directory, and the session-end jobs the
worker parked (listed and queued again by an operator)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from memlane.v1 import admin_pb2 as apb
from memlane.v1 import admin_pb2_grpc as apb_grpc

from ..access.identity import current_caller
from ..errors import InvalidArgument, PermissionDenied
from ..ids import check_id
from ..paging import decode_token, encode_token, int_cursor, page_size
from ..pipelines import user_data as export_format
from ..pipelines.user_data import Record, UserData, UserDirectory
from ..pipelines.user_import import Importer, UserImport
from ..sessions.ending import ParkedJob, SessionEndQueue
from ..sessions.events import check_event_id
from ..sessions.store import now_ms
from .procedures import check_propose

# grpcio is untyped; the alias documents what the handlers receive.
_Ctx: TypeAlias = grpc.aio.ServicerContext
_CHUNK = 1 << 20  # bytes per streamed response


# The parked-job RPCs: session-end jobs the worker gave up on (dead letters), listed and queued again
# by an operator.
_QUERY = "parked-jobs"
_RETRY_BATCH = 500


def parked_to_pb(j: ParkedJob) -> apb.ParkedJob:
    return apb.ParkedJob(
        parked_id=j.parked_id,
        session_id=j.session_id,
        reason=j.reason,
        enqueued_at_unix_ms=j.enqueued_at_ms,
        failures=j.failures,
        error=j.error,
        parked_at_unix_ms=j.parked_at_ms,
    )


def _jsonable(value: object) -> object:
    if isinstance(value, frozenset | set | tuple):
        return sorted(value, key=str)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _flat(record: dict[str, Any]) -> dict[str, Any]:
    """Nested values as JSON text, so every kind fits one flat Parquet schema."""
    return {
        k: orjson.dumps(v, default=_jsonable).decode() if isinstance(v, dict | list) else v
        for k, v in record.items()
    }


def _parquet_bytes(rows: list[dict[str, Any]]) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


class AdminServicer(apb_grpc.AdminServiceServicer):
    def __init__(
        self, user_data: UserData, queue: SessionEndQueue, users: UserDirectory, importer: UserImport
    ) -> None:
        self._data = user_data
        self._queue = queue
        self._users = users
        self._importer = importer

    async def _records(self, user_id: str) -> AsyncIterator[Record]:
        """The export's records in the file format: the header first (only when there is anything to
        export: a user memlane holds nothing about exports as nothing), then each record tagged with
        its type."""
        first = True
        async for kind, record in self._data.export(user_id):
            if first:
                yield export_format.HEADER, export_format.header(user_id)
                first = False
            yield kind, export_format.tagged(kind, record)

    async def ExportUserData(
        self, request: apb.ExportUserDataRequest, context: _Ctx
    ) -> AsyncIterator[apb.ExportUserDataResponse]:
        current_caller().check_admin("export user data", auditors_too=True)
        check_id(request.user_id, "user_id")
        known = (apb.EXPORT_FORMAT_UNSPECIFIED, apb.EXPORT_FORMAT_JSONL, apb.EXPORT_FORMAT_PARQUET)
        if request.format not in known:
            raise InvalidArgument(f"format {request.format} is not a known export format")
        if request.format == apb.EXPORT_FORMAT_PARQUET:
            async for part in self._parquet(request.user_id):
                yield part
            return
        kind, buf = "", bytearray()
        async for k, record in self._records(request.user_id):
            if buf and (k != kind or len(buf) >= _CHUNK):
                yield apb.ExportUserDataResponse(kind=kind, data=bytes(buf))
                buf.clear()
            kind = k
            buf += orjson.dumps(record, default=_jsonable) + b"\n"
        if buf:
            yield apb.ExportUserDataResponse(kind=kind, data=bytes(buf))

    async def _parquet(self, user_id: str) -> AsyncIterator[apb.ExportUserDataResponse]:
        by_kind: dict[str, list[dict[str, Any]]] = {}
        async for kind, record in self._records(user_id):
            by_kind.setdefault(kind, []).append(_flat(record))
        for kind, rows in by_kind.items():
            data = await asyncio.to_thread(_parquet_bytes, rows)
            parts = [data[i : i + _CHUNK] for i in range(0, len(data), _CHUNK)]
            for i, chunk in enumerate(parts):
                yield apb.ExportUserDataResponse(kind=kind, data=chunk, part=i, last_part=i == len(parts) - 1)

    async def ListUsers(self, request: apb.ListUsersRequest, context: _Ctx) -> apb.ListUsersResponse:
        me = current_caller()
        if not me.user_id:  # a call bound to an end user sees that user alone, whatever its role
            try:
                me.check_admin("list users", auditors_too=True)
            except PermissionDenied:
                raise PermissionDenied(
                    f"agent {me.agent_id!r} may not list users: it needs the admin or auditor role"
                ) from None
        page = await self._users.list(request.query, request.page_size, request.page_token, only=me.user_id)
        return apb.ListUsersResponse(
            users=[
                apb.UserSummary(
                    user_id=u.user_id,
                    session_count=u.session_count,
                    memory_count=u.memory_count,
                    last_session_at_unix_ms=u.last_session_at_ms,
                )
                for u in page.users
            ],
            next_page_token=page.next_page_token,
            total_size=page.total,
        )

    async def ImportUserData(
        self, request: apb.ImportUserDataRequest, context: _Ctx
    ) -> apb.ImportUserDataResponse:
        me = current_caller()
        me.check_admin("import user data")
        data = request.data
        if request.upload_id:
            # A file in parts: each held until the last, then the file is imported whole.
            check_id(request.upload_id, "upload_id")
            head, body = export_format.read_header(data)
            me.check_user(head["user_id"], "the file's user_id")
            parts = self._importer.parts
            await parts.hold(
                head["user_id"], request.upload_id, request.part, data if not request.part else body
            )
            if request.more:
                return apb.ImportUserDataResponse(user_id=head["user_id"])
            data = await parts.take(head["user_id"], request.upload_id, request.part)
        file = export_format.parse(data)
        me.check_user(file.user_id, "the file's user_id")
        importer = Importer(me.agent_id, lambda owner: check_propose(me, owner))
        receipt = await self._importer.run(file, merge=request.merge, importer=importer)
        return apb.ImportUserDataResponse(
            user_id=receipt.user_id,
            imported=receipt.imported,
            skipped=receipt.skipped,
            not_restored=receipt.not_restored,
        )

    async def ForgetUser(self, request: apb.ForgetUserRequest, context: _Ctx) -> apb.ForgetUserResponse:
        current_caller().check_admin("erase a user")
        check_id(request.user_id, "user_id")
        receipt = await self._data.erase(request.user_id)
        return apb.ForgetUserResponse(
            user_id=request.user_id,
            erased=receipt.erased,
            completed_at_unix_ms=receipt.completed_at_ms,
            operator_actions=receipt.operator_actions,
            rewritten=receipt.rewritten,
        )

    # --- Parked jobs ---------------------------------------------------------------------------------

    async def ListParkedJobs(
        self, request: apb.ListParkedJobsRequest, context: _Ctx
    ) -> apb.ListParkedJobsResponse:
        current_caller().check_admin("list parked jobs")
        size = page_size(request.page_size)
        cursor = decode_token(request.page_token, _QUERY)
        after = "-".join(str(p) for p in int_cursor(cursor, 2)) if cursor is not None else ""
        jobs = await self._queue.parked(after, size + 1)
        more = len(jobs) > size
        jobs = jobs[:size]
        token = ""
        if more:
            ms, seq = jobs[-1].parked_id.split("-")
            token = encode_token(_QUERY, [int(ms), int(seq)])
        return apb.ListParkedJobsResponse(jobs=[parked_to_pb(j) for j in jobs], next_page_token=token)

    async def RetryParkedJobs(
        self, request: apb.RetryParkedJobsRequest, context: _Ctx
    ) -> apb.RetryParkedJobsResponse:
        current_caller().check_admin("retry parked jobs")
        if request.all == bool(request.parked_ids):
            raise InvalidArgument("name parked_ids or set all (not both)")
        if len(request.parked_ids) > _RETRY_BATCH:
            raise InvalidArgument(f"parked_ids has {len(request.parked_ids)} entries; at most {_RETRY_BATCH}")
        for i, pid in enumerate(request.parked_ids):
            check_event_id(pid, f"parked_ids[{i}]")
            if "-" not in pid:
                raise InvalidArgument(f"parked_ids[{i}] {pid!r} is not a parked job id (ms-seq)")
        out = apb.RetryParkedJobsResponse()
        if request.all:
            while batch := await self._queue.parked("", _RETRY_BATCH):
                await self._queue.unpark(batch, now_ms())
                out.retried.extend(parked_to_pb(j) for j in batch)
            return out
        ids = list(dict.fromkeys(request.parked_ids))
        found = await self._queue.parked_by_id(ids)
        await self._queue.unpark(list(found.values()), now_ms())
        out.retried.extend(parked_to_pb(j) for j in found.values())
        out.not_parked.extend(pid for pid in ids if pid not in found)
        return out
