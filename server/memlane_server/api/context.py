"""ContextService: streamed working-memory assembly, client summaries and turn traces over gRPC."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TypeAlias

import grpc

from memlane.v1 import context_pb2 as cpb
from memlane.v1 import context_pb2_grpc as cpb_grpc

from ..access.identity import current_caller
from ..context import (
    AssembleRequest,
    AssembleStats,
    BlockMessage,
    ContextAssembler,
    Provenance,
    SectionCaps,
    TurnTrace,
)
from ..errors import InvalidArgument
from .blocks import block_to_pb, conversation_field, turn_entry
from .convert import summary_to_pb
from .enums import FALLBACK, PROVENANCE, SECTION, STRATEGY

_Ctx: TypeAlias = grpc.aio.ServicerContext
# What a request may leave out (an A/B baseline): long-term memory, the summary.
OMITTABLE = frozenset({Provenance.PROFILE, Provenance.MEMORY, Provenance.SUMMARY})


def request_from_pb(r: cpb.AssembleContextRequest) -> AssembleRequest:
    strategy = STRATEGY.parse(r.strategy, "strategy")
    omit: set[Provenance] = set()
    for p in r.omit:
        left_out = PROVENANCE.from_pb(p)
        if left_out is None or left_out not in OMITTABLE:
            raise InvalidArgument(
                "omit may name PROVENANCE_PROFILE, PROVENANCE_MEMORY and PROVENANCE_SUMMARY only"
            )
        omit.add(left_out)
    return AssembleRequest(
        session_id=r.session_id,
        user_input=r.user_input,
        model=r.model,
        context_window=r.context_window_tokens,
        reserved_output=r.reserved_output_tokens,
        system_prompt=r.system_prompt if r.HasField("system_prompt") else None,
        caps=SectionCaps(
            system=r.caps.system_tokens,
            profile=r.caps.profile_tokens,
            memory=r.caps.memory_tokens,
            history=r.caps.history_tokens,
        ),
        strategy=strategy,
        window_turns=r.window_turns,
        memory_limit=r.memory_limit,
        render_text=r.render_text,
        request_id=r.request_id,
        viewer=current_caller(),
        omit=frozenset(omit),
    )


def request_to_pb(r: AssembleRequest) -> cpb.AssembleContextRequest:
    out = cpb.AssembleContextRequest(
        session_id=r.session_id,
        user_input=r.user_input,
        model=r.model,
        context_window_tokens=r.context_window,
        reserved_output_tokens=r.reserved_output,
        caps=cpb.SectionCaps(
            system_tokens=r.caps.system,
            profile_tokens=r.caps.profile,
            memory_tokens=r.caps.memory,
            history_tokens=r.caps.history,
        ),
        strategy=STRATEGY.to_pb(r.strategy),
        window_turns=r.window_turns,
        memory_limit=r.memory_limit,
        render_text=r.render_text,
        request_id=r.request_id,
        omit=[PROVENANCE.to_pb(p) for p in sorted(r.omit)],
    )
    if r.system_prompt is not None:
        out.system_prompt = r.system_prompt
    return out


def stats_to_pb(s: AssembleStats) -> cpb.AssembleStats:
    out = cpb.AssembleStats(
        trace_id=s.trace_id,
        model=s.model,
        context_window_tokens=s.context_window,
        reserved_output_tokens=s.reserved_output,
        input_tokens=s.input_tokens,
        total_tokens=s.total_tokens,
        headroom_tokens=s.headroom_tokens,
        strategy=STRATEGY.to_pb(s.strategy),
        summary_through_seq=s.summary_through_seq,
        summary_behind=s.summary_behind,
        fallback=FALLBACK.to_pb(s.fallback),
        dropped_message_count=s.dropped_message_count,
        gap_message_count=s.gap_message_count,
        summarization_scheduled=s.summarization_scheduled,
        budgets=[
            cpb.SectionBudget(
                section=SECTION.to_pb(b.section),
                cap_tokens=b.cap_tokens,
                used_tokens=b.used_tokens,
            )
            for b in s.budgets
        ],
        truncations=[
            cpb.Truncation(
                section=SECTION.to_pb(t.section),
                reason=t.reason,
                tokens_removed=t.tokens_removed,
                items_removed=t.items_removed,
            )
            for t in s.truncations
        ],
        elapsed_us=s.elapsed_us,
    )
    if s.summary_request is not None:
        r = s.summary_request
        out.summary_request.CopyFrom(
            cpb.SummaryRange(
                after_seq=r.after_seq,
                through_seq=r.through_seq,
                through_message_id=r.through_message_id,
                budget_tokens=r.budget_tokens,
            )
        )
    return out


def trace_to_pb(t: TurnTrace) -> cpb.TurnTrace:
    return cpb.TurnTrace(
        trace_id=t.trace_id,
        session_id=t.session_id,
        created_at_unix_ms=t.created_at_ms,
        request=request_to_pb(t.request),
        blocks=[block_to_pb(b) for b in t.blocks],
        stats=stats_to_pb(t.stats),
    )


class ContextServicer(cpb_grpc.ContextServiceServicer):
    def __init__(
        self, assembler: ContextAssembler, on_stats: Callable[[AssembleStats], None] | None = None
    ) -> None:
        self._assembler = assembler
        self._on_stats = on_stats  # metrics of each finished assembly (truncations, summary lag)

    # Widens the generated signature: a response may be pre-encoded bytes (see the last line).
    async def AssembleContext(  # type: ignore[override]
        self, request: cpb.AssembleContextRequest, context: _Ctx
    ) -> AsyncIterator[cpb.AssembleContextResponse | bytes]:
        memo, sid = self._assembler.turn_memo, request.session_id

        def entry(m: BlockMessage) -> bytes:
            # Turns are immutable: encode each once (about 5 us a turn, 1 ms for a 200-turn history).
            data = memo.get(sid, m.message_id, m.seq)
            if data is None:
                data = turn_entry(m)
                memo.put(sid, m.message_id, m.seq, data)
            return data

        async for flush in self._assembler.assemble(request_from_pb(request)):
            blocks, tail = flush.blocks, None
            if blocks and blocks[-1].provenance == Provenance.CONVERSATION:
                # The last block of its flush: its encoded entry can follow the rest of the response.
                tail = conversation_field(blocks[-1], entry)
                if tail is not None:
                    blocks = blocks[:-1]
            out = cpb.AssembleContextResponse(blocks=[block_to_pb(b) for b in blocks])
            if flush.stats is not None:
                out.stats.CopyFrom(stats_to_pb(flush.stats))
                if self._on_stats is not None:
                    self._on_stats(flush.stats)
            if flush.stored is not None:
                await flush.stored  # the stats name the trace: it must be stored before they go out
            # Pre-encoded bytes go out as they are (the boundary's serializer passes bytes through).
            yield out if tail is None else out.SerializeToString() + tail

    async def SubmitSummary(
        self, request: cpb.SubmitSummaryRequest, context: _Ctx
    ) -> cpb.SubmitSummaryResponse:
        summary = await self._assembler.submit_summary(
            request.session_id,
            request.text,
            request.after_seq,
            request.through_seq,
            request.through_message_id,
        )
        return cpb.SubmitSummaryResponse(summary=summary_to_pb(summary))

    async def GetTurnTrace(self, request: cpb.GetTurnTraceRequest, context: _Ctx) -> cpb.GetTurnTraceResponse:
        trace = await self._assembler.get_trace(request.session_id, request.trace_id, current_caller())
        return cpb.GetTurnTraceResponse(trace=trace_to_pb(trace))

    async def ListTurnTraces(
        self, request: cpb.ListTurnTracesRequest, context: _Ctx
    ) -> cpb.ListTurnTracesResponse:
        traces, token = await self._assembler.list_traces(
            current_caller(), request.session_id, request.page_size, request.page_token
        )
        return cpb.ListTurnTracesResponse(traces=[trace_to_pb(t) for t in traces], next_page_token=token)
