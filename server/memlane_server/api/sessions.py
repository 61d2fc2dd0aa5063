"""SessionService: short-term memory over gRPC."""

from __future__ import annotations

from typing import Any, TypeAlias

import grpc
from memlane.v1 import session_service_pb2 as spb
from memlane.v1 import session_service_pb2_grpc as spb_grpc

from ..errors import InvalidArgument
from ..sessions.model import PromotionState, Role, Session, SessionStatus
from ..sessions.store import MessageFilter, SessionFilter, SessionStore
from .convert import message_from_pb, message_to_pb, session_to_pb

# grpcio is untyped; the alias documents what the handlers receive.
_Ctx: TypeAlias = grpc.aio.ServicerContext


def _enum(cls: type[Any], value: int, field: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        raise InvalidArgument(f"{field} {value} is not a known value") from None


class SessionServicer(spb_grpc.SessionServiceServicer):
    def __init__(self, store: SessionStore) -> None:
        self._store = store

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
        )
        session, created = await self._store.create(draft)
        return spb.CreateSessionResponse(session=session_to_pb(session), created=created)

    async def GetSession(self, request: spb.GetSessionRequest, context: _Ctx) -> spb.GetSessionResponse:
        return spb.GetSessionResponse(session=session_to_pb(await self._store.get(request.session_id)))

    async def ListSessions(self, request: spb.ListSessionsRequest, context: _Ctx) -> spb.ListSessionsResponse:
        f = SessionFilter(
            user_id=request.user_id,
            status=_enum(SessionStatus, request.status, "status"),
            channel=request.channel,
            created_after_ms=request.created_after_unix_ms,
            created_before_ms=request.created_before_unix_ms,
            promotion_state=_enum(PromotionState, request.promotion_state, "promotion_state"),
        )
        sessions, token = await self._store.list_sessions(f, request.page_size, request.page_token)
        return spb.ListSessionsResponse(sessions=[session_to_pb(s) for s in sessions], next_page_token=token)

    async def UpdateSession(
        self, request: spb.UpdateSessionRequest, context: _Ctx
    ) -> spb.UpdateSessionResponse:
        s = request.session
        if not request.update_mask.paths:
            raise InvalidArgument("update_mask must name at least one field")
        fields: dict[str, Any] = {}
        for path in request.update_mask.paths:
            if path in ("tags", "participants"):
                fields[path] = list(getattr(s, path))
            elif path == "metadata":
                fields[path] = dict(s.metadata)
            elif path == "status":
                fields[path] = _enum(SessionStatus, s.status, "session.status")
            elif path in ("group", "model", "ttl_seconds"):
                fields[path] = getattr(s, path)
            else:
                fields[path] = None  # the store names every field it cannot update
        updated = await self._store.update(s.session_id, fields)
        return spb.UpdateSessionResponse(session=session_to_pb(updated))

    async def CloseSession(self, request: spb.CloseSessionRequest, context: _Ctx) -> spb.CloseSessionResponse:
        return spb.CloseSessionResponse(session=session_to_pb(await self._store.close(request.session_id)))

    async def AppendMessages(
        self, request: spb.AppendMessagesRequest, context: _Ctx
    ) -> spb.AppendMessagesResponse:
        msgs = [message_from_pb(m, i) for i, m in enumerate(request.messages)]
        out = await self._store.append(request.session_id, msgs)
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
            roles=frozenset(_enum(Role, r, "roles[]") for r in request.roles),
            source_agent_ids=frozenset(request.source_agent_ids),
        )
        if request.order not in (0, 1, 2):
            raise InvalidArgument(f"order {request.order} is not a known value")
        msgs, token = await self._store.list_messages(
            request.session_id, f, request.page_size, request.page_token
        )
        return spb.ListMessagesResponse(messages=[message_to_pb(m) for m in msgs], next_page_token=token)
