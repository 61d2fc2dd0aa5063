"""AdminService's parked-job RPCs: session-end jobs the worker gave up on (dead letters), listed and
queued again by an operator. A mixin so admin.py stays about export and erasure."""

from __future__ import annotations

from typing import TypeAlias

import grpc

from memlane.v1 import admin_pb2 as apb

from ..access.identity import current_caller
from ..errors import InvalidArgument
from ..paging import decode_token, encode_token, int_cursor, page_size
from ..sessions.ending import ParkedJob, SessionEndQueue
from ..sessions.events import check_event_id
from ..sessions.store import now_ms

_Ctx: TypeAlias = grpc.aio.ServicerContext
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


class ParkedJobsMixin:
    _queue: SessionEndQueue

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
