"""``memlane eval locomo --compare memory-off``: what long-term memory adds to the assembled context.

After a conversation's sessions are replayed and promoted, an *asking* session continues it: the last
session's turns are appended again to a new open session, as if the agent carried on talking. Each
question is then assembled as the next turn twice, in the same window: with memory, and with
``omit=[PROFILE, MEMORY]`` (AssembleContextRequest's per-request baseline). Scored per question: the
share of its evidence turns the context holds, either verbatim (the conversation block's messages) or
through a recalled memory's source turns. Evidence in the last session counts for both sides, so the
difference is exactly what recall from earlier sessions buys.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TextIO

import memlane
from memlane.v1 import context_pb2 as cpb
from memlane.v1 import memory_pb2 as mpb

from .dataset import CATEGORIES, SCORED, Conversation, turn_messages

WINDOW_TOKENS = 4096
NONE: tuple[cpb.Provenance.ValueType, ...] = ()
OFF: tuple[cpb.Provenance.ValueType, ...] = (cpb.PROVENANCE_PROFILE, cpb.PROVENANCE_MEMORY)


@dataclass(slots=True)
class Coverage:
    by_category: dict[int, list[float]] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)

    def add(self, category: int, covered: set[str], evidence: frozenset[str], tokens: int) -> None:
        self.by_category.setdefault(category, []).append(len(covered & evidence) / len(evidence))
        self.tokens.append(tokens)

    def mean(self, categories: Iterable[int]) -> float:
        values = [v for c in categories for v in self.by_category.get(c, [])]
        return sum(values) / len(values) if values else 0.0


@dataclass(slots=True)
class MemoryOffComparison:
    memory_on: Coverage = field(default_factory=Coverage)
    memory_off: Coverage = field(default_factory=Coverage)

    def ask(self, client: memlane.Client, user_id: str, agent: str, conv: Conversation) -> None:
        session_id = f"{user_id}-ask"
        client.create_session(
            session_id=session_id, user_id=user_id, agent_id=agent, participants=list(conv.speakers)
        )
        last = conv.sessions[-1]
        client.append_messages(
            session_id=session_id,
            messages=turn_messages(last.turns),
        )
        who = mpb.Caller(user_id=user_id, agent_id=agent)
        sources: dict[str, tuple[str, ...]] = {}
        for q in conv.questions:
            for side, omit in ((self.memory_on, NONE), (self.memory_off, OFF)):
                covered, tokens = _context(client, who, session_id, q.text, omit=omit, sources=sources)
                side.add(q.category, covered, q.evidence, tokens)

    def to_json(self) -> dict[str, dict[str, float]]:
        rows = {f"{c}-{CATEGORIES[c]}": (c,) for c in SCORED} | {"overall_1_4": SCORED}
        return {
            label: {"memory": self.memory_on.mean(cats), "memory_off": self.memory_off.mean(cats)}
            for label, cats in rows.items()
        }

    def print(self, out: TextIO) -> None:
        w = out.write
        w(
            f"\ncontext A/B (--compare memory-off): evidence turns inside the assembled context,"
            f" {WINDOW_TOKENS}-token window, asked as the next turn of the last session\n"
        )
        w(f"{'category':<18}{'memory':>9}{'off':>9}{'gain':>9}\n")
        rows = [(f"{c} {CATEGORIES[c]}", (c,)) for c in SCORED] + [("overall 1-4", SCORED)]
        for label, cats in rows:
            on, off = self.memory_on.mean(cats), self.memory_off.mean(cats)
            w(f"{label:<18}{on:>9.3f}{off:>9.3f}{on - off:>+9.3f}\n")
        for name, side in (("memory", self.memory_on), ("off", self.memory_off)):
            mean = sum(side.tokens) / max(1, len(side.tokens))
            w(f"context tokens ({name}): mean {mean:.0f}\n")


def _context(
    client: memlane.Client,
    who: mpb.Caller,
    session_id: str,
    question: str,
    *,
    omit: tuple[cpb.Provenance.ValueType, ...],
    sources: dict[str, tuple[str, ...]],
) -> tuple[set[str], int]:
    """The turns the assembled context holds, and its size in tokens."""
    covered: set[str] = set()
    tokens = 0
    for resp in client.assemble_context(
        session_id=session_id, user_input=question, context_window_tokens=WINDOW_TOKENS, omit=list(omit)
    ):
        for block in resp.blocks:
            tokens += block.token_count
            covered.update(m.message_id for m in block.messages if m.message_id)
            for ref in block.memories:
                if ref.memory_id not in sources:
                    got = client.get_memory(caller=who, memory_id=ref.memory_id).memory
                    sources[ref.memory_id] = tuple(got.source_message_ids)
                covered.update(sources[ref.memory_id])
    return covered, tokens
