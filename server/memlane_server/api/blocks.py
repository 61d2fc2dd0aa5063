"""Context blocks on the wire: a block's protobuf form, and the conversation block assembled from its
turns' pre-encoded entries.

Why pre-encoded: a turn never changes under its id and seq, so its wire form is kept across assemblies
(``context/history.py``) and a 200-turn history goes out as one join of kept bytes instead of 200
messages built and serialized again: 20-70 us instead of 0.25-1 ms on a 2-core machine, a tenth or less
(``benchmarks/bench_block_encoding.py``; the first assembly of a history, which encodes every entry,
costs about half as much again as protobuf alone). The framing around those bytes is the only
protobuf written by hand: a field's tag comes from its descriptor, and ``tests/unit/test_block_wire.py``
holds the result to protobuf's own encoding and parse.
"""

from __future__ import annotations

from collections.abc import Callable

from google.protobuf.descriptor import FieldDescriptor

from memlane.v1 import context_pb2 as cpb
from memlane.v1 import session_pb2 as pb

from ..context import Block, BlockMessage
from .enums import PROVENANCE, ROLE
from .memory import score_parts_to_pb


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
