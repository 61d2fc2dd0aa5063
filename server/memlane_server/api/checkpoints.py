"""CheckpointService: a framework's own state per session (LangGraph checkpoints) over gRPC.

Checkpoints are session-wide state: any caller that may use the session reads them, and writing them
follows the write rule of a session-wide message (auditors never write).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeAlias, TypeVar

import grpc

from memlane.v1 import checkpoint_pb2 as kpb
from memlane.v1 import checkpoint_pb2_grpc as kpb_grpc

from ..access.identity import SESSION, current_caller
from ..errors import InvalidArgument, NotFound
from ..pipelines import Resumer
from ..sessions.checkpoints import Checkpoint, CheckpointStore, ThreadRetired, Typed, Write
from ..sessions.ids import check_id
from ..sessions.lifecycle import Lifecycle
from ..sessions.model import Session
from ..sessions.store import SessionStore

_Ctx: TypeAlias = grpc.aio.ServicerContext
T = TypeVar("T")


def _typed(t: kpb.TypedValue) -> Typed:
    return Typed(t.type, t.data)


def _typed_pb(t: Typed) -> kpb.TypedValue:
    return kpb.TypedValue(type=t.type, data=t.data)


def checkpoint_to_pb(cp: Checkpoint) -> kpb.CheckpointRecord:
    return kpb.CheckpointRecord(
        session_id=cp.session_id,
        namespace=cp.namespace,
        checkpoint_id=cp.checkpoint_id,
        parent_checkpoint_id=cp.parent_checkpoint_id,
        checkpoint=_typed_pb(cp.checkpoint),
        metadata_json=cp.metadata_json,
        channel_versions=cp.channel_versions,
        channel_values=[
            kpb.ChannelValue(channel=ch, version=ver, value=_typed_pb(v)) for ch, ver, v in cp.channel_values
        ],
        pending_writes=[
            kpb.PendingWrite(
                task_id=w.task_id,
                index=w.index,
                channel=w.channel,
                value=_typed_pb(w.value),
                task_path=w.task_path,
            )
            for w in cp.writes
        ],
        created_at_unix_ms=cp.created_at_ms,
    )


def _may_write(what: str) -> None:
    current_caller().check_write(SESSION, "", "", what)


class CheckpointServicer(kpb_grpc.CheckpointServiceServicer):
    def __init__(
        self, checkpoints: CheckpointStore, sessions: SessionStore, lifecycle: Lifecycle, resumer: Resumer
    ) -> None:
        self._checkpoints = checkpoints
        self._sessions = sessions
        self._lifecycle = lifecycle
        self._hot = resumer.ensure_hot

    async def _resuming(self, session_id: str, op: Callable[[], Awaitable[T]]) -> T:
        """Runs ``op``; a retired thread (its state in the archive) is resumed once and ``op`` retried.
        The scripts detect retirement themselves, so a hot thread pays no extra round trip."""
        try:
            return await op()
        except ThreadRetired:
            await self._hot(session_id)
            return await op()

    async def PutCheckpoint(
        self, request: kpb.PutCheckpointRequest, context: _Ctx
    ) -> kpb.PutCheckpointResponse:
        _may_write("checkpoint")
        cp = Checkpoint(
            session_id=request.session_id,
            namespace=request.namespace,
            checkpoint_id=request.checkpoint_id,
            parent_checkpoint_id=request.parent_checkpoint_id,
            checkpoint=_typed(request.checkpoint),
            metadata_json=request.metadata_json,
            channel_versions=dict(request.channel_versions),
        )
        values = [(v.channel, v.version, _typed(v.value)) for v in request.new_values]
        await self._resuming(cp.session_id, lambda: self._checkpoints.put(cp, values))
        return kpb.PutCheckpointResponse(checkpoint_id=cp.checkpoint_id)

    async def PutCheckpointWrites(
        self, request: kpb.PutCheckpointWritesRequest, context: _Ctx
    ) -> kpb.PutCheckpointWritesResponse:
        _may_write("checkpoint writes")
        writes = [Write(w.task_id, w.index, w.channel, _typed(w.value), w.task_path) for w in request.writes]
        stored = await self._resuming(
            request.session_id,
            lambda: self._checkpoints.put_writes(
                request.session_id, request.namespace, request.checkpoint_id, writes
            ),
        )
        return kpb.PutCheckpointWritesResponse(stored=stored)

    async def GetCheckpoint(
        self, request: kpb.GetCheckpointRequest, context: _Ctx
    ) -> kpb.GetCheckpointResponse:
        cp = await self._resuming(
            request.session_id,
            lambda: self._checkpoints.get(request.session_id, request.namespace, request.checkpoint_id),
        )
        if cp is None:
            return kpb.GetCheckpointResponse(found=False)
        return kpb.GetCheckpointResponse(found=True, checkpoint=checkpoint_to_pb(cp))

    async def ListCheckpoints(
        self, request: kpb.ListCheckpointsRequest, context: _Ctx
    ) -> kpb.ListCheckpointsResponse:
        rows, token = await self._resuming(
            request.session_id,
            lambda: self._checkpoints.list_page(
                request.session_id,
                request.namespace if request.HasField("namespace") else None,
                before=request.before_checkpoint_id,
                metadata_filter_json=request.metadata_filter_json,
                size=request.page_size,
                token=request.page_token,
            ),
        )
        return kpb.ListCheckpointsResponse(
            checkpoints=[checkpoint_to_pb(c) for c in rows], next_page_token=token
        )

    async def DeleteCheckpoints(
        self, request: kpb.DeleteCheckpointsRequest, context: _Ctx
    ) -> kpb.DeleteCheckpointsResponse:
        _may_write("checkpoints")
        # A retired thread's state is in the archive, which its next resumption restores: resume it
        # first, so the deletion reaches that state instead of the empty hot keys.
        await self._hot(request.session_id)
        return kpb.DeleteCheckpointsResponse(
            deleted=await self._checkpoints.delete_thread(request.session_id)
        )

    async def CopyCheckpoints(
        self, request: kpb.CopyCheckpointsRequest, context: _Ctx
    ) -> kpb.CopyCheckpointsResponse:
        _may_write("checkpoints")
        await self._hot(request.source_session_id)
        source = await self._sessions.get(request.source_session_id)
        try:
            await self._sessions.get(request.target_session_id)
        except NotFound:
            # The copy is a fork of the conversation: a new thread of the same user, agent and channel.
            draft = Session(
                session_id=request.target_session_id,
                user_id=source.user_id,
                agent_id=source.agent_id,
                channel=source.channel,
                group=source.group,
                model=source.model,
                topology=source.topology,
            )
            draft, policy_ttl = self._lifecycle.policies.apply(draft)
            created, was_new = await self._sessions.create(draft, default_ttl_seconds=policy_ttl)
            if was_new:
                await self._lifecycle.created(created)
        await self._hot(request.target_session_id)
        copied = await self._checkpoints.copy(request.source_session_id, request.target_session_id)
        return kpb.CopyCheckpointsResponse(copied=copied)

    async def PruneCheckpoints(
        self, request: kpb.PruneCheckpointsRequest, context: _Ctx
    ) -> kpb.PruneCheckpointsResponse:
        _may_write("checkpoints")
        if request.strategy not in (kpb.PRUNE_STRATEGY_KEEP_LATEST, kpb.PRUNE_STRATEGY_DELETE):
            raise InvalidArgument("strategy must be PRUNE_STRATEGY_KEEP_LATEST or PRUNE_STRATEGY_DELETE")
        for i, sid in enumerate(request.session_ids):
            check_id(sid, f"session_ids[{i}]")
            await self._hot(sid)  # as DeleteCheckpoints: prune the state a resumption would restore
        deleted = await self._checkpoints.prune(
            list(request.session_ids), keep_latest=request.strategy == kpb.PRUNE_STRATEGY_KEEP_LATEST
        )
        return kpb.PruneCheckpointsResponse(deleted=deleted)

    async def DeleteCheckpointRuns(
        self, request: kpb.DeleteCheckpointRunsRequest, context: _Ctx
    ) -> kpb.DeleteCheckpointRunsResponse:
        _may_write("checkpoints")
        for sid in await self._checkpoints.run_sessions(list(request.run_ids)):
            await self._hot(sid)  # as DeleteCheckpoints: reach the state a resumption would restore
        return kpb.DeleteCheckpointRunsResponse(
            deleted=await self._checkpoints.delete_runs(list(request.run_ids))
        )
