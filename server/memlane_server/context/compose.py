"""Building blocks within their grants: pure functions over a token counter (no I/O).

Costs are chat-format costs: content tokens + ``MESSAGE_OVERHEAD_TOKENS`` (+ the name's tokens and one
separator when a message carries a name), which is what providers bill per message.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..procedures.store import Kind
from ..sessions.model import Message, Role, Summary
from ..tokens import MESSAGE_OVERHEAD_TOKENS, TokenCounter
from .budget import BudgetPolicy
from .model import Block, BlockMessage, Fallback, MemoryRef, ProcedureRef, Provenance, Strategy
from .sources import MemoryHit, ProcedureText

PROFILE_HEADING = "What is known about the user:"
MEMORY_HEADING = "Relevant memories from earlier conversations:"

_LABELS = {
    Provenance.SYSTEM: "System",
    Provenance.PROFILE: "User profile",
    Provenance.MEMORY: "Retrieved memories",
    Provenance.SUMMARY: "Summary of earlier conversation",
    Provenance.CONVERSATION: "Recent conversation",
    Provenance.PROCEDURE: "Procedures",
}


def summary_content(summary_text: str, through_seq: int) -> str:
    return f"Summary of the conversation so far (through turn {through_seq}):\n{summary_text}"


class Costing:
    """Chat-format token costs for one request's model."""

    def __init__(self, counter: TokenCounter, model: str) -> None:
        self.counter = counter
        self.model = model
        self._names: dict[str, int] = {}

    def name_cost(self, name: str) -> int:
        if not name:
            return 0
        cost = self._names.get(name)
        if cost is None:
            cost = self._names[name] = self.counter.count(name, self.model) + 1
        return cost

    def text(self, content: str) -> int:
        return self.counter.count(content, self.model)

    def message(self, content: str, name: str = "", content_tokens: int | None = None) -> int:
        tokens = self.text(content) if content_tokens is None else content_tokens
        return tokens + MESSAGE_OVERHEAD_TOKENS + self.name_cost(name)

    def fit_text(self, content: str, limit: int, name: str = "") -> tuple[str, int]:
        """The longest prefix of ``content`` whose message cost fits ``limit``, and that cost."""
        cost = self.message(content, name)
        if cost <= limit:
            return content, cost
        room = limit - MESSAGE_OVERHEAD_TOKENS - self.name_cost(name)
        while room > 0:
            cut = self.counter.truncate(content, room, self.model)
            cost = self.message(cut, name)
            # A decoded token prefix can re-encode longer (split multi-byte characters): shrink until it fits.
            if cost <= limit:
                return cut, cost
            room -= max(1, cost - limit)
        return "", 0


def text_block(costing: Costing, provenance: Provenance, content: str, limit: int) -> Block:
    """A single system message (the system prompt)."""
    block = Block(provenance, cap_tokens=limit)
    if not content:
        return block
    fitted, cost = costing.fit_text(content, limit)
    if fitted:
        block.messages.append(BlockMessage(Role.SYSTEM, fitted))
        block.token_count = cost
    block.truncated = fitted != content
    return block


def hits_block(
    costing: Costing, provenance: Provenance, heading: str, hits: Sequence[MemoryHit], limit: int
) -> Block:
    """Memories as one system message, best first, as many as fit."""
    block = Block(provenance, cap_tokens=limit)
    if not hits:
        return block
    lines = [heading]
    chosen: list[MemoryHit] = []
    # Per-line costs are additive to within a token or two; the final exact count settles it.
    running = costing.message(heading)
    for hit in hits:
        line_cost = costing.text(f"\n- {hit.text}")
        if running + line_cost > limit:
            block.truncated = True
            continue  # a shorter, lower-ranked memory may still fit
        running += line_cost
        lines.append(f"- {hit.text}")
        chosen.append(hit)
    while chosen:
        content = "\n".join(lines)
        cost = costing.message(content)
        if cost <= limit:
            block.messages.append(BlockMessage(Role.SYSTEM, content))
            block.memories = [MemoryRef(h.memory_id, h.score, h.parts) for h in chosen]
            block.token_count = cost
            return block
        chosen.pop()
        lines.pop()
        block.truncated = True
    return block


@dataclass(slots=True)
class HistoryPlan:
    """Which turns go verbatim, which fold into a gap summary, which are left out."""

    strategy: Strategy
    summary_text: str
    summary_through_seq: int
    kept: list[Message]
    kept_costs: list[int]
    gap: list[Message] = field(default_factory=list)
    dropped: int = 0
    fallback: Fallback = Fallback.NONE
    gap_summary_budget: int = 0  # content tokens the gap summary may use


def _fit_newest(costs: Sequence[int], room: int) -> int:
    """How many of the newest items fit in ``room`` (taken newest first, contiguous)."""
    total = 0
    n = 0
    for cost in reversed(costs):
        if total + cost > room:
            break
        total += cost
        n += 1
    return n


def select_history(
    strategy: Strategy,
    summary: Summary,
    candidates: list[Message],
    costs: list[int],
    limit: int,
    *,
    policy: BudgetPolicy,
    summary_cost: int,
    window_turns: int,
    unscanned: int = 0,
) -> HistoryPlan:
    """Pick the history for ``limit`` tokens.

    ``candidates`` (oldest first, with their message ``costs``) are the turns after the summary for the
    summary strategies, the whole (scanned) session for full buffer, the last N for the sliding window.
    ``unscanned`` counts older turns not even read (beyond ``max_scan_messages``): they are dropped.
    """
    if strategy in (Strategy.FULL_BUFFER, Strategy.SLIDING_WINDOW):
        if strategy == Strategy.SLIDING_WINDOW and len(candidates) > window_turns:
            start = len(candidates) - window_turns
            candidates, costs, unscanned = candidates[start:], costs[start:], 0
        n = _fit_newest(costs, limit)
        dropped = len(candidates) - n + unscanned
        return HistoryPlan(
            strategy,
            "",
            0,
            candidates[len(candidates) - n :],
            list(costs[len(costs) - n :]),
            dropped=dropped,
            fallback=Fallback.DROPPED_OLDEST if dropped else Fallback.NONE,
        )

    s_cost = summary_cost if summary.text else 0
    n = _fit_newest(costs, max(0, limit - s_cost))
    plan = HistoryPlan(strategy, summary.text, summary.through_seq, [], [])
    if n == len(candidates) and not unscanned:
        plan.kept, plan.kept_costs = candidates, list(costs)
        return plan
    if policy.fallback == Fallback.GAP_SUMMARY:
        # Behind: make room for a summary of the gap (at least as big as the stored one) and fold it in.
        budget = min(limit, max(s_cost, int(limit * policy.summary_share)))
        n = _fit_newest(costs, limit - budget)
        plan.gap = candidates[: len(candidates) - n]
        plan.gap_summary_budget = budget
        plan.dropped = unscanned
        plan.fallback = Fallback.GAP_SUMMARY
    else:
        plan.dropped = len(candidates) - n + unscanned
        plan.fallback = Fallback.DROPPED_OLDEST
    plan.kept = candidates[len(candidates) - n :]
    plan.kept_costs = list(costs[len(costs) - n :])
    return plan


def history_blocks(costing: Costing, plan: HistoryPlan, limit: int) -> tuple[Block, Block]:
    """The summary block and the conversation block; together within ``limit``."""
    conversation = Block(
        Provenance.CONVERSATION,
        token_count=sum(plan.kept_costs),
        messages=[block_message(m) for m in plan.kept],
        message_ids=[m.message_id for m in plan.kept],
        cap_tokens=limit,
    )
    conversation.truncated = plan.dropped > 0 or bool(plan.gap)
    room = limit - conversation.token_count
    summary = Block(Provenance.SUMMARY, cap_tokens=room)
    if plan.summary_text:
        full = summary_content(plan.summary_text, plan.summary_through_seq)
        fitted, cost = costing.fit_text(full, room)
        if fitted:
            summary.messages.append(BlockMessage(Role.SYSTEM, fitted))
            summary.token_count = cost
        summary.truncated = fitted != full
    return summary, conversation


def block_message(msg: Message) -> BlockMessage:
    # Positional: this runs for every turn shown, on every assembly (role, content, name, id, seq, native).
    return BlockMessage(
        msg.role,
        msg.content,
        msg.participant_name,
        msg.message_id,
        msg.seq,
        msg.native_format,
        msg.native_json,
    )


def render(block: Block) -> str:
    """A labelled plain-text form of a block, for frameworks that take one prompt string."""
    if not block.messages:
        return ""
    label = _LABELS.get(block.provenance, block.provenance.name.title())
    if block.provenance == Provenance.CONVERSATION:
        body = "\n".join(f"{m.name or Role(m.role).name.lower()}: {m.content}" for m in block.messages)
    else:
        body = "\n".join(m.content for m in block.messages)
    return f"## {label}\n{body}"


# --- The procedures block ------------------------------------------------------------------------------
# It sits in the system section, after the system prompt, and shares its grant, within its own cap
# (``context_procedures_max_tokens``); whole procedures only, most binding kinds first.

PROCEDURES_HEADING = "How to work (procedures approved for this agent):"
# Kinds by how binding they are: instructions, routines, examples.
_KIND_ORDER = {Kind.INSTRUCTION: 0, Kind.ROUTINE: 1, Kind.EXAMPLE: 2}


class ProcedureBlocks:
    """Built blocks by (model, limit, the exact versions): a version's text never changes, and an agent's
    procedures change rarely, so most assemblies reuse the block instead of tokenizing it again."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._built: OrderedDict[tuple[object, ...], Block] = OrderedDict()

    def clear(self) -> None:
        self._built.clear()

    def block(self, costing: Costing, items: Sequence[ProcedureText], limit: int) -> Block:
        key = (costing.model, limit, tuple((p.agent_id, p.group, p.procedure_id, p.version) for p in items))
        built = self._built.get(key)
        if built is None:
            built = self._built[key] = procedures_block(costing, items, limit)
            while len(self._built) > self._size:
                self._built.popitem(last=False)
        else:
            self._built.move_to_end(key)
        # A copy: assembly sets rendered_text on the block it sends.
        return replace(built, messages=list(built.messages), procedures=list(built.procedures))


def procedures_block(costing: Costing, items: Sequence[ProcedureText], limit: int) -> Block:
    """One system message holding as many whole procedures as fit ``limit`` (a shorter one may still fit
    after a longer one did not), with their refs as provenance."""
    block = Block(Provenance.PROCEDURE, cap_tokens=limit)
    ordered = sorted(items, key=lambda p: (_KIND_ORDER.get(p.kind, 9), p.group != "", p.procedure_id))
    parts = [PROCEDURES_HEADING]
    chosen: list[ProcedureText] = []
    running = costing.message(PROCEDURES_HEADING)
    for p in ordered:
        text = f"\n\n## {p.title} (v{p.version})\n{p.content}"
        cost = costing.text(text)
        if running + cost > limit:
            block.truncated = True
            continue
        running += cost
        parts.append(text)
        chosen.append(p)
    while chosen:
        content = "".join(parts)
        cost = costing.message(content)
        if cost <= limit:
            block.messages.append(BlockMessage(Role.SYSTEM, content))
            block.procedures = [ProcedureRef(p.agent_id, p.group, p.procedure_id, p.version) for p in chosen]
            block.token_count = cost
            return block
        chosen.pop()  # per-part costs are additive to within a token or two: drop the last until it fits
        parts.pop()
        block.truncated = True
    return block
