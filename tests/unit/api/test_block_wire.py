"""The conversation block assembled from pre-encoded turns (api/context.py) is what protobuf itself
encodes: its tag and lengths are protobuf's, and it parses back to exactly the block ``block_to_pb``
builds, for turns of every shape (empty, long enough for multi-byte lengths, native objects, names)."""

from __future__ import annotations

import pytest

from memlane.v1 import context_pb2 as cpb
from memlane_server.api.context import (
    block_to_pb,
    conversation_field,
    length_delimited_tag,
    turn_entry,
    varint,
)
from memlane_server.context import Block, BlockMessage, MemoryRef, Provenance
from memlane_server.sessions.model import Role


def _turns(n: int, chars: int) -> list[BlockMessage]:
    return [
        BlockMessage(
            Role.USER if i % 2 == 0 else Role.ASSISTANT,
            ("héllo wörld " * (chars // 12 + 1))[: chars + i % 3],
            name="ann" if i % 5 == 0 else "",
            message_id=f"msg_{i:04d}",
            seq=i + 1,
            native_format="openai" if i % 7 == 0 else "",
            native_json='{"role": "user"}' if i % 7 == 0 else "",
        )
        for i in range(n)
    ]


@pytest.mark.parametrize(("n", "chars"), [(0, 0), (1, 0), (3, 40), (200, 200), (5, 20_000)])
def test_the_pre_encoded_block_parses_as_protobufs_own(n: int, chars: int) -> None:
    turns = _turns(n, chars)
    block = Block(
        Provenance.CONVERSATION,
        token_count=n * 7,
        messages=turns,
        message_ids=[m.message_id for m in turns],
        rendered_text="x" * chars,
        cap_tokens=4096,
        truncated=n % 2 == 1,
    )
    field = conversation_field(block, turn_entry)
    assert field is not None
    stats = cpb.AssembleContextResponse(stats=cpb.AssembleStats(trace_id="t1"))
    sent = stats.SerializeToString() + field  # as AssembleContext sends its last flush
    expected = cpb.AssembleContextResponse(blocks=[block_to_pb(block)], stats=stats.stats)
    assert cpb.AssembleContextResponse.FromString(sent) == expected
    # One block alone is protobuf's own bytes for it: the header comes first, then each turn's entries.
    alone = cpb.AssembleContextResponse.FromString(field)
    assert alone.blocks[0] == block_to_pb(block)


def test_a_block_the_entries_cannot_express_is_left_to_protobuf() -> None:
    turns = _turns(2, 10)
    assert (
        conversation_field(Block(Provenance.CONVERSATION, messages=turns, message_ids=["other"]), turn_entry)
        is None
    )
    with_memory = Block(
        Provenance.CONVERSATION,
        messages=turns,
        message_ids=[m.message_id for m in turns],
        memories=[MemoryRef("m1", 0.5)],
    )
    assert conversation_field(with_memory, turn_entry) is None


def test_tag_and_lengths_are_protobufs() -> None:
    blocks = cpb.AssembleContextResponse.DESCRIPTOR.fields_by_name["blocks"]
    own = cpb.AssembleContextResponse(blocks=[cpb.ContextBlock()]).SerializeToString()
    assert own == length_delimited_tag(blocks) + varint(0)
    for n in (1, 127, 128, 300, 16_383, 16_384, 2**21, 2**35):  # 0 is the default, never sent
        encoded = cpb.ContextMessage(seq=n).SerializeToString()  # seq: field 6, varint
        assert encoded == b"\x30" + varint(n)
    with pytest.raises(TypeError):
        length_delimited_tag(cpb.ContextBlock.DESCRIPTOR.fields_by_name["token_count"])
