"""CheckpointService: a framework's own state per session (LangGraph checkpoints) over gRPC.

Checkpoints carry the visibility the session's topology gives its messages (``default_visibility``): in
a shared session they are session-wide, in a distributed one private to the session's agent (its
orchestrator and auditors read them too), in a selective one its group's. Reading them follows
``Caller.can_see`` and writing them ``Caller.check_write`` on that visibility (auditors never write), so
a checkpoint holding an agent's private turns is not a way around the access rule. Destroying them
(delete, prune, delete by run) is managing the session: the rule of CloseSession
(``Caller.check_manage``), so one agent cannot wipe another agent's framework state.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TypeAlias, TypeVar

import grpc

from memlane.v1 import checkpoint_pb2 as kpb
from memlane.v1 import checkpoint_pb2_grpc as kpb_grpc

from ..access.identity import AGENT, SESSION, current_caller
from ..checkpoints.store import Checkpoint, CheckpointStore, ThreadRetired, Typed, Write
from ..errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied
from ..ids import check_id
from ..pipelines import Resumer
from ..sessions.lifecycle import Lifecycle
from ..sessions.model import Session
from ..sessions.store import SessionStore, default_visibility

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


async def _check_scope(sessions: SessionStore, session_id: str, field_name: str, *, write: bool) -> None:
    """PERMISSION_DENIED unless the caller may read (or write) checkpoints of the session, whose
    topology decides their visibility. A missing session is left to the handler (NOT_FOUND, or none)."""
    caller = current_caller()
    if caller.unrestricted:
        return
    if write:
        _may_write(field_name)
    try:
        s = await sessions.get(session_id)
    except NotFound:
        return
    vis, group = default_visibility(s)
    owner = s.agent_id if vis == AGENT else ""
    if write:
        caller.check_write(vis, owner, group, field_name)
    elif not caller.can_see(vis, s.agent_id, group):
        raise PermissionDenied(
            f"{field_name}: the checkpoints of session {session_id!r} are "
            + (f"private to agent {s.agent_id!r}" if vis == AGENT else f"visible to group {group!r} only")
        )


class CheckpointServicer(kpb_grpc.CheckpointServiceServicer):
    def __init__(
        self, checkpoints: CheckpointStore, sessions: SessionStore, lifecycle: Lifecycle, resumer: Resumer
    ) -> None:
        self._checkpoints = checkpoints
        self._sessions = sessions
        self._lifecycle = lifecycle
        self._hot = resumer.ensure_hot

    async def _may_destroy(self, session_ids: Iterable[str]) -> None:
        """PERMISSION_DENIED unless the caller may manage every named session (checked before anything is
        deleted, so a refused call deletes nothing). A missing session has no state to protect."""
        caller = current_caller()
        if caller.unrestricted:
            return
        _may_write("checkpoints")
        for session_id in session_ids:
            try:
                session = await self._sessions.get(session_id)
            except NotFound:
                continue
            caller.check_manage(session.agent_id, "", "delete the checkpoints of")

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
        await _check_scope(self._sessions, request.session_id, "session_id", write=True)
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
        await _check_scope(self._sessions, request.session_id, "session_id", write=True)
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
        await _check_scope(self._sessions, request.session_id, "session_id", write=False)
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
        await _check_scope(self._sessions, request.session_id, "session_id", write=False)
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
        await self._may_destroy([request.session_id])
        # A retired thread's state is in the archive, which its next resumption restores: resume it
        # first, so the deletion reaches that state instead of the empty hot keys.
        await self._hot(request.session_id)
        return kpb.DeleteCheckpointsResponse(
            deleted=await self._checkpoints.delete_thread(request.session_id)
        )

    async def CopyCheckpoints(
        self, request: kpb.CopyCheckpointsRequest, context: _Ctx
    ) -> kpb.CopyCheckpointsResponse:
        await _check_scope(self._sessions, request.source_session_id, "source_session_id", write=False)
        await _check_scope(self._sessions, request.target_session_id, "target_session_id", write=True)
        await self._hot(request.source_session_id)
        source = await self._sessions.get(request.source_session_id)
        try:
            target = await self._sessions.get(request.target_session_id)
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
            target, was_new = await self._sessions.create(draft, default_ttl_seconds=policy_ttl)
            if was_new:
                await self._lifecycle.created(target)
        if target.user_id != source.user_id:  # one user's state never lands in another user's thread
            raise AlreadyExists(
                f"target_session_id {request.target_session_id!r} is a session of another user"
            )
        await self._hot(request.target_session_id)
        copied = await self._checkpoints.copy(request.source_session_id, request.target_session_id)
        return kpb.CopyCheckpointsResponse(copied=copied)

    async def PruneCheckpoints(
        self, request: kpb.PruneCheckpointsRequest, context: _Ctx
    ) -> kpb.PruneCheckpointsResponse:
        await self._may_destroy(request.session_ids)
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
        sids = await self._checkpoints.run_sessions(list(request.run_ids))
        await self._may_destroy(sids)
        for sid in sids:
            await self._hot(sid)  # as DeleteCheckpoints: reach the state a resumption would restore
        return kpb.DeleteCheckpointRunsResponse(
            deleted=await self._checkpoints.delete_runs(list(request.run_ids))
        )
