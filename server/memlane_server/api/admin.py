"""AdminService: per-user export and erasure."""

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
from ..errors import InvalidArgument
from ..ids import check_id
from ..pipelines.user_data import UserData
from ..sessions.end_queue import SessionEndQueue
from .parked_jobs import ParkedJobsMixin

# grpcio is untyped; the alias documents what the handlers receive.
_Ctx: TypeAlias = grpc.aio.ServicerContext
_CHUNK = 1 << 20  # bytes per streamed response


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


class AdminServicer(ParkedJobsMixin, apb_grpc.AdminServiceServicer):
    def __init__(self, user_data: UserData, queue: SessionEndQueue) -> None:
        self._data = user_data
        self._queue = queue

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
        async for k, record in self._data.export(request.user_id):
            if buf and (k != kind or len(buf) >= _CHUNK):
                yield apb.ExportUserDataResponse(kind=kind, data=bytes(buf))
                buf.clear()
            kind = k
            buf += orjson.dumps(record, default=_jsonable) + b"\n"
        if buf:
            yield apb.ExportUserDataResponse(kind=kind, data=bytes(buf))

    async def _parquet(self, user_id: str) -> AsyncIterator[apb.ExportUserDataResponse]:
        by_kind: dict[str, list[dict[str, Any]]] = {}
        async for kind, record in self._data.export(user_id):
            by_kind.setdefault(kind, []).append(_flat(record))
        for kind, rows in by_kind.items():
            data = await asyncio.to_thread(_parquet_bytes, rows)
            parts = [data[i : i + _CHUNK] for i in range(0, len(data), _CHUNK)]
            for i, chunk in enumerate(parts):
                yield apb.ExportUserDataResponse(kind=kind, data=chunk, part=i, last_part=i == len(parts) - 1)

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
