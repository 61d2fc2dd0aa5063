"""Encoding AssembleContext's conversation block of 200 turns both ways: built and serialized by protobuf
each time, or joined from each turn's pre-encoded entry (api/context.py; the entries kept across
assemblies by context/history.py). Also the first assembly of a history, when every entry is encoded.

    python benchmarks/bench_block_encoding.py [--turns 200]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from memlane.v1 import context_pb2 as cpb
from memlane_server.api.context import block_to_pb, conversation_field, turn_entry
from memlane_server.context import Block, BlockMessage, Provenance
from memlane_server.sessions.model import Role


def _block(turns: int, chars: int) -> Block:
    messages = [
        BlockMessage(
            Role.USER if i % 2 == 0 else Role.ASSISTANT,
            ("word " * (chars // 5 + 1))[:chars],
            message_id=f"msg_{i:026d}",
            seq=i + 1,
        )
        for i in range(turns)
    ]
    return Block(
        Provenance.CONVERSATION,
        token_count=turns * chars // 4,
        messages=messages,
        message_ids=[m.message_id for m in messages],
        cap_tokens=128_000,
    )


def _median_us(fn: Callable[[], bytes], reps: int = 50) -> float:
    samples = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        samples.append((time.perf_counter() - start) / reps * 1e6)
    return statistics.median(samples)


def _row(block: Block, stats: bytes) -> str:
    kept = {turn.message_id: turn_entry(turn) for turn in block.messages}

    def protobuf() -> bytes:
        return cpb.AssembleContextResponse(blocks=[block_to_pb(block)]).SerializeToString() + stats

    def from_kept(turn: BlockMessage) -> bytes:
        return kept[turn.message_id]

    def pre_encoded() -> bytes:
        field = conversation_field(block, from_kept)
        assert field is not None
        return stats + field

    def first_time() -> bytes:
        field = conversation_field(block, turn_entry)
        assert field is not None
        return stats + field

    parse = cpb.AssembleContextResponse.FromString
    assert parse(protobuf()) == parse(pre_encoded()) == parse(first_time())
    return (
        f"({len(protobuf())} bytes): protobuf {_median_us(protobuf):.0f} us, "
        f"pre-encoded (entries kept) {_median_us(pre_encoded):.0f} us, "
        f"pre-encoded first time (every entry encoded) {_median_us(first_time):.0f} us"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    args = parser.parse_args()
    stats = cpb.AssembleContextResponse(stats=cpb.AssembleStats(trace_id="t")).SerializeToString()
    for chars in (200, 1000):
        print(f"{args.turns} turns of {chars} characters " + _row(_block(args.turns, chars), stats))


if __name__ == "__main__":
    main()
