"""What a LoCoMo run measures beside evidence recall, each asked for by a flag of ``memlane eval locomo``:
what long-term memory adds to the assembled context (``--compare memory-off``), and whether tuned recall knobs
generalize (``--leave-one-out``).

**Memory off** (``MemoryOffComparison``). After a conversation's sessions are replayed and promoted, an
*asking* session continues it: the last session's turns are appended again to a new open session, as if the
agent carried on talking. Each question is then assembled as the next turn twice, in the same window: with
memory, and with ``omit=[PROFILE, MEMORY]`` (AssembleContextRequest's per-request baseline). Scored per
question: the share of its evidence turns the context holds, either verbatim (the conversation block's
messages) or through a recalled memory's source turns. Evidence in the last session counts for both sides,
so the difference is exactly what recall from earlier sessions buys.

**Leave one conversation out** (``LeaveOneOut``, ``evaluate``): does a choice of ranking knobs generalize to
a conversation it was not chosen on?

After the normal run's ingest, the table it wrote is opened in process and every question is asked once per
configuration of a small grid of recall knobs (fusion weights and ``k``: what a tuner would turn; ingest is
not re-run, so only query-time knobs are in the grid). For each conversation in turn, the configuration with
the best recall within 512 tokens on the *other* conversations is chosen and scored on the held-out one. The
pooled held-out figure is the leave-one-out recall; next to it, the shipped defaults on the same path and
the figure each fold's choice had on its own four conversations. A large gap between the two last ones is
tuning that does not generalize.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import memlane
from memlane.v1 import context_pb2 as cpb
from memlane.v1 import memory_pb2 as mpb

from ..config import Settings
from ..embedding import OnnxEmbedder
from ..ltm import LanceMemoryStore, MemoryService, MemoryTuning, RecallQuery, Visibility
from ..tokens import TokenCounter
from ..wiring.stores import memory_tuning
from .evidence import CATEGORIES, SCORED, Conversation, Retrieved, Scores, turn_messages

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


# Leave one conversation out.

BUDGET_KEY = "recall@512tok"
# The grid: each knob at the shipped value and on either side of it.
GRID: dict[str, tuple[float, ...]] = {
    "keyword_weight": (1.0, 1.5, 2.0),
    "rrf_k": (2.0, 4.0, 10.0),
    "expansion_weight": (0.5, 1.0),
}


def configurations(base: MemoryTuning) -> list[dict[str, float]]:
    """Every point of ``GRID``; the shipped defaults first (they win ties)."""
    shipped = {k: float(getattr(base, k)) for k in GRID}
    points = [dict(zip(GRID, values, strict=True)) for values in itertools.product(*GRID.values())]
    return [shipped, *(p for p in points if p != shipped)]


@dataclass(slots=True)
class Fold:
    held_out: int  # index of the conversation scored
    chosen: dict[str, float]
    tuned_on_rest: float  # recall@512 of the chosen configuration on the other conversations
    held_out_score: float


@dataclass(slots=True)
class LeaveOneOut:
    configs: list[dict[str, float]]
    # scores[config][conversation][category] over categories 1-4
    scores: list[list[dict[int, Scores]]] = field(default_factory=list)
    folds: list[Fold] = field(default_factory=list)

    def pooled(self, config: int, convs: Sequence[int]) -> Scores:
        total = Scores()
        for c in convs:
            for cat in SCORED:
                if cat in self.scores[config][c]:
                    total.merge(self.scores[config][c][cat])
        return total

    def held_out(self, category: int | None = None) -> Scores:
        total = Scores()
        for fold in self.folds:
            per_cat = self.scores[self.configs.index(fold.chosen)][fold.held_out]
            for cat in SCORED if category is None else (category,):
                if cat in per_cat:
                    total.merge(per_cat[cat])
        return total

    def shipped(self, category: int | None = None) -> Scores:
        total = Scores()
        for per_cat in self.scores[0]:
            for cat in SCORED if category is None else (category,):
                if cat in per_cat:
                    total.merge(per_cat[cat])
        return total

    def choose(self) -> None:
        n = len(self.scores[0])
        for held in range(n):
            rest = [c for c in range(n) if c != held]
            best = max(
                range(len(self.configs)), key=lambda i: (self.pooled(i, rest).summary()[BUDGET_KEY], -i)
            )
            self.folds.append(
                Fold(
                    held,
                    self.configs[best],
                    self.pooled(best, rest).summary()[BUDGET_KEY],
                    self.pooled(best, [held]).summary()[BUDGET_KEY],
                )
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "grid": GRID,
            "folds": [
                {
                    "conversation": f.held_out,
                    "chosen": f.chosen,
                    "tuned_on_rest": f.tuned_on_rest,
                    "held_out": f.held_out_score,
                }
                for f in self.folds
            ],
            "held_out_overall_1_4": self.held_out().summary(),
            "held_out_categories": {f"{c}-{CATEGORIES[c]}": self.held_out(c).summary() for c in SCORED},
            "shipped_overall_1_4": self.shipped().summary(),
            "shipped_categories": {f"{c}-{CATEGORIES[c]}": self.shipped(c).summary() for c in SCORED},
        }

    def print(self, out: TextIO = sys.stdout) -> None:
        w = out.write
        w(f"\nleave-one-conversation-out over {len(self.configs)} recall configurations ({BUDGET_KEY}):\n")
        for f in self.folds:
            knobs = ", ".join(f"{k}={v:g}" for k, v in f.chosen.items())
            w(
                f"  held out conversation {f.held_out}: chose {knobs}; on the other four"
                f" {f.tuned_on_rest:.3f}, held out {f.held_out_score:.3f}\n"
            )
        cells = [(CATEGORIES[c], c) for c in SCORED]
        w(f"  {'':<26}" + "".join(f"{name:>13}" for name, _ in cells) + f"{'overall 1-4':>13}\n")
        for label, scores in (("shipped defaults", self.shipped), ("leave-one-out (chosen)", self.held_out)):
            row = [scores(c).summary()[BUDGET_KEY] for _, c in cells] + [scores().summary()[BUDGET_KEY]]
            w(f"  {label:<26}" + "".join(f"{v:>13.3f}" for v in row) + "\n")
        mean_rest = sum(f.tuned_on_rest for f in self.folds) / max(1, len(self.folds))
        mean_held = sum(f.held_out_score for f in self.folds) / max(1, len(self.folds))
        w(f"  mean over folds: tuned-on-four {mean_rest:.3f}, held out {mean_held:.3f}\n")


async def _ask_all(
    service: MemoryService,
    *,
    users: Sequence[str],
    agent: str,
    conversations: Sequence[Conversation],
    tokens: TokenCounter,
    limit: int,
) -> list[dict[int, Scores]]:
    per_conv: list[dict[int, Scores]] = []
    for user, conv in zip(users, conversations, strict=True):
        cats: dict[int, Scores] = {}
        for q in conv.questions:
            if q.category not in SCORED:
                continue
            hits = await service.search(RecallQuery(Visibility(user, agent, []), q.text, limit))
            got = [
                Retrieved(h.item.content, tuple(h.item.source_message_ids), tokens.count(h.item.content))
                for h in hits
            ]
            cats.setdefault(q.category, Scores()).add(got, q.evidence)
        per_conv.append(cats)
    return per_conv


async def _evaluate(
    table: Path,
    embedder: OnnxEmbedder,
    *,
    users: Sequence[str],
    agent: str,
    conversations: Sequence[Conversation],
    tokens: TokenCounter,
    limit: int,
    base: MemoryTuning,
) -> LeaveOneOut:
    store = await LanceMemoryStore.open(str(table), embedder.ndims)
    result = LeaveOneOut(configurations(base))
    try:
        for config in result.configs:
            service = MemoryService(
                store, embedder, _tuned(base, config), hot_index_mb=Settings().ltm.ltm_hot_index_mb
            )
            try:
                asked = await _ask_all(
                    service, users=users, agent=agent, conversations=conversations, tokens=tokens, limit=limit
                )
                result.scores.append(asked)
            finally:
                await service.close()
    finally:
        store.close()
    result.choose()
    return result


def evaluate(
    table: Path,
    embedder: OnnxEmbedder,
    *,
    users: Sequence[str],
    agent: str,
    conversations: Sequence[Conversation],
    tokens: TokenCounter,
    limit: int,
    base: MemoryTuning | None = None,
) -> LeaveOneOut:
    """``table``: the LanceDB directory the run's sidecar wrote (stopped by now); ``users[i]`` holds
    ``conversations[i]``."""
    return asyncio.run(
        _evaluate(
            table,
            embedder,
            users=users,
            agent=agent,
            conversations=conversations,
            tokens=tokens,
            limit=limit,
            base=base or memory_tuning(Settings().ltm),
        )
    )


def _tuned(base: MemoryTuning, config: dict[str, float]) -> MemoryTuning:
    return replace(
        base,
        keyword_weight=config["keyword_weight"],
        rrf_k=config["rrf_k"],
        expansion_weight=config["expansion_weight"],
    )
