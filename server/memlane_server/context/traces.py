"""Turn traces: what one assembly decided and why, encoded as JSON and kept with the session's storage
(sessions/traces.py owns the Redis side: keys, the trimming script, reads)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from ..access.identity import Caller, CallerRole
from ..errors import InvalidArgument, NotFound
from ..ltm.model import ScoreParts
from ..paging import cursor_of, decode_token, encode_token, fitting, page_size, query_fingerprint
from ..sessions.model import Role
from ..sessions.store import SessionStore
from ..sessions.traces import TraceRecords
from .compose import block_message, render
from .model import (
    AssembleRequest,
    AssembleStats,
    Block,
    BlockMessage,
    Fallback,
    MemoryRef,
    ProcedureRef,
    Provenance,
    Section,
    SectionBudget,
    SectionCaps,
    Strategy,
    SummaryRange,
    Truncation,
    TurnTrace,
)

MAX_PAGE_SIZE = 100
DEFAULT_PAGE_SIZE = 20


def new_trace_id(now_ms: int) -> str:
    """Time-sortable: 13 digits of ms, then randomness (ids of one ms never collide in practice)."""
    return f"{now_ms:013d}-{os.urandom(6).hex()}"


# Score parts are stored as a bare list in this field order (a trace holds up to memory_limit of
# them, and nine key names per memory would double a memory block's stored size).
_PARTS = tuple(f.name for f in dataclasses.fields(ScoreParts))


def _jsonable(value: object) -> object:
    if isinstance(value, frozenset):  # the viewer's roles, groups, delegates
        return sorted(value)
    if isinstance(value, ScoreParts):
        return [getattr(value, name) for name in _PARTS]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # orjson hands dataclasses here (OPT_PASSTHROUGH_DATACLASS) so ScoreParts above can be compact;
        # a shallow dict keeps the nested values going through orjson (and back here) as before.
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    raise TypeError(f"cannot store {type(value).__name__} in a trace")


def _parts(raw: list[float] | None) -> ScoreParts | None:
    """Traces stored before score parts were kept have none (``MemoryRef.parts`` stays None)."""
    if raw is None:
        return None
    kw_rank, kw_score, vec_rank, vec_sim, fused, recency, usage, importance, final = raw  # _PARTS order
    return ScoreParts(
        int(kw_rank), kw_score, int(vec_rank), vec_sim, fused, recency, usage, importance, final
    )


def encode_trace(trace: TurnTrace) -> bytes:
    """Conversation turns are stored as their ids only (``Block.message_ids``): messages are immutable,
    so the id is the content, and a trace costs a few KB instead of a second copy of the history (and
    erasure has one copy less to find). ``TraceStore`` puts the turns back on read.

    Procedures are kept by reference only (``Block.procedures``: owner, id, version; GetProcedure has
    the text): an approved example may quote the user it was learned from, and erasing that user must
    take it out of every other user's traces too, which a copy here would defeat."""
    slim = dataclasses.replace(
        trace,
        blocks=[
            dataclasses.replace(b, messages=[], rendered_text="")
            if b.provenance in (Provenance.CONVERSATION, Provenance.PROCEDURE)
            else b
            for b in trace.blocks
        ],
    )
    return orjson.dumps(slim, default=_jsonable, option=orjson.OPT_PASSTHROUGH_DATACLASS)


def _viewer(v: dict[str, Any]) -> Caller:
    return Caller(
        agent_id=v["agent_id"],
        roles=frozenset(CallerRole(r) for r in v["roles"]),
        groups=frozenset(v["groups"]),
        delegates=frozenset(v["delegates"]),
        how=v["how"],
        unrestricted=v["unrestricted"],
    )


def decode_trace(raw: bytes) -> TurnTrace:
    d = orjson.loads(raw)
    req = d["request"]
    st = d["stats"]
    sr = st.get("summary_request")
    return TurnTrace(
        trace_id=d["trace_id"],
        session_id=d["session_id"],
        created_at_ms=d["created_at_ms"],
        request=AssembleRequest(
            **{
                **req,
                "caps": SectionCaps(**req["caps"]),
                "strategy": Strategy(req["strategy"]),
                "viewer": _viewer(req["viewer"]),
                "omit": frozenset(Provenance(p) for p in req.get("omit", ())),  # absent in older traces
            }
        ),
        blocks=[_block(b) for b in d["blocks"]],
        stats=AssembleStats(
            **{
                **st,
                "strategy": Strategy(st["strategy"]),
                "fallback": Fallback(st["fallback"]),
                "summary_request": SummaryRange(**sr) if sr else None,
                "budgets": [
                    SectionBudget(Section(b["section"]), b["cap_tokens"], b["used_tokens"])
                    for b in st["budgets"]
                ],
                "truncations": [_truncation(t) for t in st["truncations"]],
            }
        ),
    )


def _block(b: dict[str, Any]) -> Block:
    return Block(
        **{
            **b,
            "provenance": Provenance(b["provenance"]),
            "messages": [BlockMessage(**{**m, "role": Role(m["role"])}) for m in b["messages"]],
            "memories": [
                MemoryRef(m["memory_id"], m["score"], _parts(m.get("parts"))) for m in b["memories"]
            ],
            "procedures": [ProcedureRef(**p) for p in b.get("procedures", [])],
        }
    )


def _truncation(t: dict[str, Any]) -> Truncation:
    return Truncation(**{**t, "section": Section(t["section"])})


class TraceStore:
    """Turn traces of assemblies: encoded here, kept by the session's storage (sessions/traces.py), and
    read back with their conversation turns put back from the session's messages."""

    def __init__(self, records: TraceRecords) -> None:
        self.records = records

    async def put(self, trace: TurnTrace) -> None:
        await self.records.put(trace.session_id, trace.trace_id, encode_trace(trace), trace.created_at_ms)

    async def get(self, session_id: str, trace_id: str) -> TurnTrace:
        if not session_id or not trace_id:
            raise InvalidArgument("session_id and trace_id are required")
        raw = await self.records.get(session_id, trace_id)
        if raw is None:
            raise NotFound(f"trace {trace_id} of session {session_id} not found")
        return (await self._rehydrate(session_id, [decode_trace(raw)]))[0]

    async def _rehydrate(self, session_id: str, traces: list[TurnTrace]) -> list[TurnTrace]:
        """Puts the conversation turns of stored traces back, from the session's messages."""
        ids = sorted(
            {
                mid
                for t in traces
                for b in t.blocks
                if b.provenance == Provenance.CONVERSATION
                for mid in b.message_ids
            }
        )
        if not ids:
            return traces
        stored = {mid: block_message(m) for mid, m in (await self.records.messages(session_id, ids)).items()}
        for t in traces:
            for b in t.blocks:
                if b.provenance == Provenance.CONVERSATION:
                    # A turn retired from Redis since keeps its id, with no content.
                    b.messages = [
                        stored.get(mid) or BlockMessage(Role.UNSPECIFIED, "", message_id=mid)
                        for mid in b.message_ids
                    ]
                    if t.request.render_text:
                        b.rendered_text = render(b)
        return traces

    async def export(self, session_id: str) -> AsyncIterator[dict[str, Any]]:
        """Every trace of the session as a record (ExportUserData), newest first, turns put back."""
        token = ""
        while True:
            page, token = await self.list(session_id, 100, token)
            for trace in page:
                yield dataclasses.asdict(trace)
            if not token:
                return

    async def list(self, session_id: str, size: int, token: str) -> tuple[list[TurnTrace], str]:
        """Newest first. The token holds the last (score, id) returned, so inserts never shift pages."""
        size = page_size(size, default=DEFAULT_PAGE_SIZE, maximum=MAX_PAGE_SIZE)
        query = query_fingerprint("traces", session_id)
        cursor = decode_token(token, query)
        before: tuple[int, str] | None = None
        if cursor is not None:
            score, trace_id = cursor_of(cursor, int, str)
            before = (score, trace_id)
        rows = await self.records.newest(session_id, size, before)
        page = rows[:size]
        if not page:
            return [], ""
        raws = await self.records.payloads(session_id, [tid for tid, _ in page])
        stored = [(row, raw) for row, raw in zip(page, raws, strict=True) if raw is not None]
        traces = await self._rehydrate(session_id, [decode_trace(raw) for _, raw in stored])
        # Bounded in bytes too: rehydrated turns make a trace as heavy as the context it replays.
        keep = fitting(len(raw) + _turn_bytes(t) for (_, raw), t in zip(stored, traces, strict=True))
        if keep < len(stored):
            (last_id, last_score), _ = stored[keep - 1]
            return traces[:keep], encode_token(query, [last_score, last_id])
        last_id, last_score = page[-1]
        return traces, (encode_token(query, [last_score, last_id]) if len(rows) > size else "")


def _turn_bytes(trace: TurnTrace) -> int:
    return sum(
        len(m.content.encode()) + len(m.native_json.encode()) for b in trace.blocks for m in b.messages
    )


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# --- trace_access ----------------------------------------------------------------------------------------
# Turn traces as callers see them: recorded after each assembly, replayed only to those allowed.
#
# A trace holds what one caller's model saw, private turns included: only that caller, an auditor, or an
# orchestrator reading for it may replay it. Others get NOT_FOUND / a filtered page. (``traces`` is the
# storage; this is the access rule on top.)


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
