"""Turn traces as callers see them: recorded after each assembly, replayed only to those allowed.

A trace holds what one caller's model saw, private turns included: only that caller, an auditor, or an
orchestrator reading for it may replay it. Others get NOT_FOUND / a filtered page. (``traces`` is the
storage; this is the access rule on top.)
"""

from __future__ import annotations

from ..access.identity import Caller
from ..errors import InvalidArgument, NotFound
from ..sessions.store import SessionStore
from .model import TurnTrace
from .traces import TraceStore


class TurnTraces:
    def __init__(self, traces: TraceStore, store: SessionStore) -> None:
        self.store = traces
        self._sessions = store

    async def record(self, trace: TurnTrace) -> None:
        await self.store.put(trace)

    async def get(self, session_id: str, trace_id: str, viewer: Caller) -> TurnTrace:
        trace = await self.store.get(session_id, trace_id)
        if not viewer.reads_for(trace.request.viewer.agent_id):
            raise NotFound(f"trace {trace_id!r} not found in session {session_id!r}")
        return trace

    async def list(
        self, viewer: Caller, session_id: str, page_size: int, page_token: str
    ) -> tuple[list[TurnTrace], str]:
        if not session_id:
            raise InvalidArgument("session_id is required")
        await self._sessions.get(session_id)  # NOT_FOUND for an unknown session, not an empty page
        traces, token = await self.store.list(session_id, page_size, page_token)
        return [t for t in traces if viewer.reads_for(t.request.viewer.agent_id)], token
