"""SessionService: short-term memory over gRPC."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc

from memlane.v1 import session_pb2 as pb
from memlane.v1 import session_service_pb2 as spb
from memlane.v1 import session_service_pb2_grpc as spb_grpc

from ..access.identity import current_caller
from ..errors import InvalidArgument, PermissionDenied
from ..pipelines import Resumer
from ..pipelines.incremental import LearnScheduler
from ..pipelines.on_request import EndOnRequest
from ..sessions.edits import MessageEditor, MessageRemover
from ..sessions.events import SessionEvent
from ..sessions.lifecycle import Lifecycle
from ..sessions.limits import check_batch_count
from ..sessions.model import Message, Role, Session, SessionStatus
from ..sessions.store import MessageFilter, SessionFilter, SessionStore
from .convert import message_from_pb, message_to_pb, session_to_pb
from .enums import EVENT_TYPE, PROMOTION_STATE, ROLE, SESSION_STATUS, TOPOLOGY

# grpcio is untyped; the alias documents what the handlers receive.
_Ctx: TypeAlias = grpc.aio.ServicerContext


def event_to_pb(ev: SessionEvent) -> spb.SessionEvent:
    return spb.SessionEvent(
        event_id=ev.event_id,
        type=EVENT_TYPE.to_pb(ev.type),
        session_id=ev.session_id,
        user_id=ev.user_id,
        channel=ev.channel,
        status=SESSION_STATUS.to_pb(ev.status),
        promotion_state=PROMOTION_STATE.to_pb(ev.promotion_state),
        at_unix_ms=ev.at_ms,
        detail=ev.detail,
    )


def _edited_fields(m: pb.Message) -> Message:
    """What UpdateMessage may set; role, author, visibility and time are never read from the request."""
    return Message(
        message_id=m.message_id,
        session_id="",
        role=Role.UNSPECIFIED,
        content=m.content,
        native_format=m.native.format,
        native_json=m.native.json,
        tool_call_ids=list(m.tool_call_ids),
        metadata=dict(m.metadata),
    )


class SessionServicer(spb_grpc.SessionServiceServicer):
    def __init__(
        self,
        store: SessionStore,
        *,
        lifecycle: Lifecycle,
        end_on_request: EndOnRequest,
        resumer: Resumer,
        remover: MessageRemover,
        editor: MessageEditor,
        learner: LearnScheduler | None = None,
    ) -> None:
        self._store = store
        self._learner = learner
        self._remover = remover
        self._editor = editor
        self._lifecycle = lifecycle
        self._end_on_request = end_on_request
        self._resumer = resumer

    async def _check_manage(
        self, session_id: str, action: str, group: str = "", *, unless_ended: bool = False
    ) -> None:
        """NOT_FOUND for a missing session, then ``Caller.check_manage`` against the session's creator."""
        current = await self._store.get(session_id)
        if unless_ended and current.status in (SessionStatus.CLOSED, SessionStatus.EXPIRED):
            return
        current_caller().check_manage(current.agent_id, group, action)

    async def CreateSession(
        self, request: spb.CreateSessionRequest, context: _Ctx
    ) -> spb.CreateSessionResponse:
        draft = Session(
            session_id=request.session_id,
            user_id=request.user_id,
            agent_id=request.agent_id,
            channel=request.channel,
            participants=list(request.participants),
            group=request.group,
            tags=list(request.tags),
            metadata=dict(request.metadata),
            model=request.model,
            ttl_seconds=request.ttl_seconds,
            topology=TOPOLOGY.parse(request.topology, "topology"),
        )
        me = current_caller()
        if not me.unrestricted:
            # The creator is the caller; a group session is opened by a member of the group.
            if draft.agent_id and draft.agent_id != me.agent_id:
                raise PermissionDenied(
                    f"agent_id {draft.agent_id!r} is not the calling agent {me.agent_id!r}"
                )
            draft.agent_id = me.agent_id
            if draft.group and draft.group not in me.groups:
                raise PermissionDenied(f"agent {me.agent_id!r} is not a member of group {draft.group!r}")
        draft, policy_ttl = self._lifecycle.policies.apply(draft)
        session, created = await self._store.create(draft, default_ttl_seconds=policy_ttl)
        if created:
            await self._lifecycle.created(session)
        return spb.CreateSessionResponse(session=session_to_pb(session), created=created)

    async def GetSession(self, request: spb.GetSessionRequest, context: _Ctx) -> spb.GetSessionResponse:
        session = await self._store.get(request.session_id)
        if await self._resumer.resume_if_retired(session):  # reloaded from the archive: read it again
            session = await self._store.get(request.session_id)
        return spb.GetSessionResponse(session=session_to_pb(session))

    async def ListSessions(self, request: spb.ListSessionsRequest, context: _Ctx) -> spb.ListSessionsResponse:
        f = SessionFilter(
            user_id=request.user_id,
            status=SESSION_STATUS.parse(request.status, "status"),
            channel=request.channel,
            created_after_ms=request.created_after_unix_ms,
            created_before_ms=request.created_before_unix_ms,
            promotion_state=PROMOTION_STATE.parse(request.promotion_state, "promotion_state"),
        )
        sessions, token = await self._store.list_sessions(f, request.page_size, request.page_token)
        return spb.ListSessionsResponse(sessions=[session_to_pb(s) for s in sessions], next_page_token=token)

    async def UpdateSession(
        self, request: spb.UpdateSessionRequest, context: _Ctx
    ) -> spb.UpdateSessionResponse:
        s = request.session
        if not request.update_mask.paths:
            raise InvalidArgument("update_mask must name at least one field")
        await self._check_manage(
            s.session_id, "update", s.group if "group" in request.update_mask.paths else ""
        )
        fields: dict[str, Any] = {}
        for path in request.update_mask.paths:
            if path in ("tags", "participants"):
                fields[path] = list(getattr(s, path))
            elif path == "metadata":
                fields[path] = dict(s.metadata)
            elif path == "status":
                fields[path] = SESSION_STATUS.parse(s.status, "session.status")
            elif path in ("group", "model", "ttl_seconds"):
                fields[path] = getattr(s, path)
            else:
                fields[path] = None  # the store names every field it cannot update
        # Closing is the lifecycle's (event, session-end job), however the caller asks for it.
        closing = fields.get("status") == SessionStatus.CLOSED
        if closing:
            del fields["status"]
        updated = await self._store.update(s.session_id, fields)
        if closing:
            updated = await self._lifecycle.close(s.session_id)
        return spb.UpdateSessionResponse(session=session_to_pb(updated))

    async def CloseSession(self, request: spb.CloseSessionRequest, context: _Ctx) -> spb.CloseSessionResponse:
        await self._check_manage(request.session_id, "close")
        return spb.CloseSessionResponse(
            session=session_to_pb(await self._lifecycle.close(request.session_id))
        )

    async def AppendMessages(
        self, request: spb.AppendMessagesRequest, context: _Ctx
    ) -> spb.AppendMessagesResponse:
        sid, writer = request.session_id, current_caller()
        check_batch_count(len(request.messages), self._store.limits)
        # The append path's one retry policy (sessions/messages.py AppendRetries) says which refusals go
        # again, how often and why; an expired session is taken up again by ``revive`` (with RESUMED),
        # and the batch built afresh for it from the request.
        out = await self._store.append_reviving(
            sid,
            lambda: [message_from_pb(m, i) for i, m in enumerate(request.messages)],
            writer,
            self._resumer.revive,
        )
        if self._learner is not None:  # in memory only: a worker learns
            said = sum(
                m.role == pb.ROLE_USER and not m.transient and not dup
                for m, dup in zip(request.messages, out.duplicates, strict=True)
            )
            self._learner.notice(request.session_id, out.duplicates.count(False), user_turns=said)
        return spb.AppendMessagesResponse(
            results=[
                spb.AppendResult(message_id=mid, seq=seq, token_count=n, duplicate=dup)
                for mid, seq, n, dup in zip(
                    out.message_ids, out.seqs, out.token_counts, out.duplicates, strict=True
                )
            ],
            token_total=out.token_total,
            message_count=out.message_count,
        )

    async def ListMessages(self, request: spb.ListMessagesRequest, context: _Ctx) -> spb.ListMessagesResponse:
        f = MessageFilter(
            newest_first=request.order == spb.MESSAGE_ORDER_NEWEST_FIRST,
            after_ms=request.after_unix_ms,
            before_ms=request.before_unix_ms,
            roles=frozenset(ROLE.parse(r, "roles[]") for r in request.roles),
            source_agent_ids=frozenset(request.source_agent_ids),
            participant_names=frozenset(request.participant_names),
            user_ids=frozenset(request.user_ids),
            viewer=current_caller(),
        )
        if request.order not in (0, 1, 2):
            raise InvalidArgument(f"order {request.order} is not a known value")
        # Retired sessions are rare: the page read says whether it met one, and is read again after the
        # resumption.
        page = await self._store.list_messages(request.session_id, f, request.page_size, request.page_token)
        if page.retired and await self._resumer.ensure_hot(request.session_id):
            page = await self._store.list_messages(
                request.session_id, f, request.page_size, request.page_token
            )
        return spb.ListMessagesResponse(
            messages=[message_to_pb(m) for m in page.messages], next_page_token=page.next_token
        )

    async def RemoveMessages(
        self, request: spb.RemoveMessagesRequest, context: _Ctx
    ) -> spb.RemoveMessagesResponse:
        await self._resumer.ensure_hot(request.session_id)
        out = await self._remover.remove(
            request.session_id,
            request.request_id,
            message_ids=list(request.message_ids),
            last=request.last,
            everything=request.all,
            caller=current_caller(),
        )
        return spb.RemoveMessagesResponse(
            removed=[message_to_pb(m) for m in out.removed],
            removed_count=out.removed_count,
            token_total=out.token_total,
            message_count=out.message_count,
        )

    async def UpdateMessage(
        self, request: spb.UpdateMessageRequest, context: _Ctx
    ) -> spb.UpdateMessageResponse:
        await self._resumer.ensure_hot(request.session_id)
        out = await self._editor.edit(
            request.session_id,
            request.message.message_id,
            _edited_fields(request.message),
            list(request.update_mask.paths),
            caller=current_caller(),
        )
        return spb.UpdateMessageResponse(message=message_to_pb(out.message), token_total=out.token_total)

    async def PromoteSession(
        self, request: spb.PromoteSessionRequest, context: _Ctx
    ) -> spb.PromoteSessionResponse:
        if request.close:  # closing through promotion is closing: the same rule as CloseSession
            await self._check_manage(request.session_id, "close", unless_ended=True)
        await self._resumer.ensure_hot(request.session_id)
        remaining = context.time_remaining()
        # Wait for another sidecar's run for most of the call's deadline, leaving time to answer.
        wait_s = max(0.0, (remaining if remaining is not None else 30.0) * 0.8)
        report = await self._end_on_request.run(request.session_id, close=request.close, wait_s=wait_s)
        return spb.PromoteSessionResponse(
            session=session_to_pb(report.session),
            promoted_memory_ids=report.promoted_ids,
            archive_uris=[p.transcript for p in report.archives],
        )

    async def WatchSessionEvents(
        self, request: spb.WatchSessionEventsRequest, context: _Ctx
    ) -> AsyncIterator[spb.WatchSessionEventsResponse]:
        types = [EVENT_TYPE.parse(t, "types[]") for t in request.types]
        async for ev in self._lifecycle.events.follow(
            user_id=request.user_id, channel=request.channel, types=types, after_id=request.after_event_id
        ):
            yield spb.WatchSessionEventsResponse(event=event_to_pb(ev))
