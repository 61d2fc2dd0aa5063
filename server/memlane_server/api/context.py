"""ContextService: streamed working-memory assembly, client summaries and turn traces over gRPC, and
the wire form of a context block (the conversation block joined from its turns' pre-encoded entries)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TypeAlias

import grpc
from google.protobuf.descriptor import FieldDescriptor

from memlane.v1 import context_pb2 as cpb
from memlane.v1 import context_pb2_grpc as cpb_grpc
from memlane.v1 import session_pb2 as pb

from ..access.identity import current_caller
from ..context import (
    AssembleRequest,
    AssembleStats,
    Block,
    BlockMessage,
    ContextAssembler,
    Provenance,
    SectionCaps,
    TurnTrace,
)
from ..context.model import SECTION_ORDER, cap_name
from ..errors import InvalidArgument
from .convert import summary_to_pb
from .enums import FALLBACK, PROVENANCE, ROLE, SECTION, STRATEGY
from .memory import score_parts_to_pb

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
        caps=_caps_from_pb(r.caps),
        strategy=strategy,
        window_turns=r.window_turns,
        memory_limit=r.memory_limit,
        render_text=r.render_text,
        request_id=r.request_id,
        viewer=current_caller(),
        omit=frozenset(omit),
    )


def _caps_from_pb(caps: cpb.SectionCaps) -> SectionCaps:
    """Each section's cap, for the sections as listed once (``context.model.SECTION_ORDER``)."""
    return SectionCaps(**{cap_name(s): getattr(caps, f"{cap_name(s)}_tokens") for s in SECTION_ORDER})


def _caps_to_pb(caps: SectionCaps) -> cpb.SectionCaps:
    return cpb.SectionCaps(**{f"{cap_name(s)}_tokens": getattr(caps, cap_name(s)) for s in SECTION_ORDER})


def request_to_pb(r: AssembleRequest) -> cpb.AssembleContextRequest:
    out = cpb.AssembleContextRequest(
        session_id=r.session_id,
        user_input=r.user_input,
        model=r.model,
        context_window_tokens=r.context_window,
        reserved_output_tokens=r.reserved_output,
        caps=cpb.SectionCaps(
            **{f"{cap_name(s)}_tokens": getattr(r.caps, cap_name(s)) for s in SECTION_ORDER}
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
                memory_ids=t.memory_ids,
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


# --- Context blocks on the wire ---------------------------------------------------------------------------
# Context blocks on the wire: a block's protobuf form, and the conversation block assembled from its
# turns' pre-encoded entries.
#
# Why pre-encoded: a turn never changes under its id and seq, so its wire form is kept across assemblies
# (``context/history.py``) and a 200-turn history goes out as one join of kept bytes instead of 200
# messages built and serialized again: 20-70 us instead of 0.25-1 ms on a 2-core machine, a tenth or less
# (``benchmarks/bench_block_encoding.py``; the first assembly of a history, which encodes every entry,
# costs about half as much again as protobuf alone). The framing around those bytes is the only
# protobuf written by hand: a field's tag comes from its descriptor, and ``tests/unit/test_block_wire.py``
# holds the result to protobuf's own encoding and parse.


def length_delimited_tag(field: FieldDescriptor) -> bytes:
    """The tag that opens one entry of a message field (wire type 2: a length follows)."""
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        raise TypeError(f"{field.full_name} is not a message field")
    return varint(field.number << 3 | 2)


def varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# AssembleContextResponse.blocks, where a pre-encoded conversation block goes.
_BLOCKS_TAG = length_delimited_tag(cpb.AssembleContextResponse.DESCRIPTOR.fields_by_name["blocks"])


def _message_pb(m: BlockMessage) -> cpb.ContextMessage:
    msg = cpb.ContextMessage(
        role=ROLE.to_pb(m.role), name=m.name, content=m.content, message_id=m.message_id, seq=m.seq
    )
    if m.native_format or m.native_json:
        msg.native.CopyFrom(pb.NativeMessage(format=m.native_format, json=m.native_json))
    return msg


def turn_entry(m: BlockMessage) -> bytes:
    """One turn as it travels inside a ``ContextBlock``: its ``message_ids`` entry and its ``messages``
    entry (field tags and lengths included). Repeated fields keep their order whatever lies between
    them, so a block's entries concatenated turn after turn parse back as its two lists."""
    return cpb.ContextBlock(message_ids=[m.message_id], messages=[_message_pb(m)]).SerializeToString()


def conversation_field(b: Block, entry: Callable[[BlockMessage], bytes]) -> bytes | None:
    """The conversation block as an ``AssembleContextResponse.blocks`` entry, built from each turn's
    encoded entry (``entry``, e.g. from a cache) without decoding or re-encoding any turn. None when its
    ids are not exactly its turns' (then ``block_to_pb`` builds it)."""
    ids = b.message_ids
    if len(ids) != len(b.messages) or b.memories or b.procedures:
        return None
    parts = [_block_header(b).SerializeToString()]
    for m, mid in zip(b.messages, ids, strict=True):
        if m.message_id != mid:
            return None
        parts.append(entry(m))
    body = b"".join(parts)
    return _BLOCKS_TAG + varint(len(body)) + body


def _block_header(b: Block) -> cpb.ContextBlock:
    """The block's own fields, without its messages, memories or procedures."""
    return cpb.ContextBlock(
        provenance=PROVENANCE.to_pb(b.provenance),
        token_count=b.token_count,
        rendered_text=b.rendered_text,
        cap_tokens=b.cap_tokens,
        truncated=b.truncated,
    )


def block_to_pb(b: Block) -> cpb.ContextBlock:
    out = _block_header(b)
    out.message_ids.extend(b.message_ids)
    out.memories.extend(
        cpb.MemoryRef(
            memory_id=m.memory_id,
            score=m.score,
            parts=score_parts_to_pb(m.parts) if m.parts else None,
        )
        for m in b.memories
    )
    out.procedures.extend(
        cpb.ProcedureRef(agent_id=p.agent_id, group=p.group, procedure_id=p.procedure_id, version=p.version)
        for p in b.procedures
    )
    out.messages.extend([_message_pb(m) for m in b.messages])
    return out
