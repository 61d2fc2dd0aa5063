"""The pure core of assembly: from gathered inputs to blocks and stats, with no I/O and no awaits.

``settle`` turns a request and its session into the request's choices (model, window, strategy,
budgets); a ``Composition`` then builds the sections in priority order (system, profile, memory,
history), each within what its ``Ledger`` grants, so the headroom invariant holds whatever the inputs
hold. ``compose`` runs every step on inputs gathered in full; the streaming assembler runs the same
steps as each input arrives (a step called out of order raises, so the two cannot drift apart).

The one input the core cannot hold up front is the gap summary (it folds turns the plan picks): the
history step returns the ``GapFold`` it needs, and the caller hands the folded summary back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..ltm.recall import text_key
from ..sessions.model import ChannelPolicy, Message, Role, Session, Summary
from ..tokens import MESSAGE_OVERHEAD_TOKENS, TokenCounter
from .budget import BudgetPlan, BudgetPolicy, Ledger, plan_budget, resolve_window
from .compose import (
    MEMORY_HEADING,
    PROFILE_HEADING,
    Costing,
    HistoryPlan,
    history_blocks,
    hits_block,
    procedures_block,
    render,
    select_history,
    summary_content,
    text_block,
)
from .model import (
    SECTION_ORDER,
    AssembleRequest,
    AssembleStats,
    Block,
    Fallback,
    GapFold,
    Provenance,
    Section,
    Strategy,
    SummaryRange,
    Truncation,
    resolve_strategy,
    resolve_window_turns,
)
from .sources import MemoryHit, ProcedureText
from .summaries import viewer_summary

# Builds the procedures block (``procedures_block``, or a cache of it): costing, procedures, limit.
BuildProcedures = Callable[[Costing, Sequence[ProcedureText], int], Block]

# Room the summary block's own heading takes, kept out of the summary's content budget.
SUMMARY_HEADING_TOKENS = 24
SUMMARIZED = (Strategy.HYBRID, Strategy.ROLLING_SUMMARY)
# The rule that keeps a profile item out of the memory block, as the turn trace states it.
PROFILE_REPEAT_REASON = "already in the profile block"
TEXT_REPEAT_REASON = "the same text as another memory"
WEAK_HIT_REASON = "below the relevance floor (context_memory_min_similarity)"
STALE_REASON = "an episode carrying a superseded fact"


@dataclass(slots=True)
class Settled:
    """One request's settled choices: what every later step is decided against."""

    req: AssembleRequest
    session: Session
    model: str
    strategy: Strategy
    window_turns: int
    costing: Costing
    plan: BudgetPlan
    input_tokens: int
    stats: AssembleStats


def settle(
    req: AssembleRequest,
    session: Session,
    *,
    policy: BudgetPolicy,
    channel: ChannelPolicy,
    counter: TokenCounter,
    default_model: str,
    trace_id: str,
) -> Settled:
    """The request's model, window, strategy and budgets (raises ``InvalidArgument`` when they clash)."""
    model = req.model or session.model or default_model
    window = resolve_window(model, req.context_window)
    reserved = req.reserved_output or min(policy.default_reserved_output, window // 4)
    strategy = resolve_strategy(req, session.metadata, channel, policy.default_strategy)
    costing = Costing(counter, model)
    input_tokens = costing.message(req.user_input) if req.user_input else 0
    plan = plan_budget(window, reserved, input_tokens, req.caps, policy)
    stats = AssembleStats(
        trace_id=trace_id,
        model=model,
        context_window=window,
        reserved_output=reserved,
        strategy=strategy,
        summary_through_seq=session.summary.through_seq,
    )
    window_turns = resolve_window_turns(req, channel, policy.window_turns)
    return Settled(req, session, model, strategy, window_turns, costing, plan, input_tokens, stats)


@dataclass(slots=True)
class GatheredHistory:
    """The turns read for the history section, and the content tokens of those the viewer may read."""

    candidates: list[Message]  # every stored turn read (all visibilities), oldest first
    readable: list[Message]  # those the viewer may read, oldest first
    content_tokens: list[int]  # per readable turn, in the request's encoding
    unscanned: int = 0  # older turns beyond the scan limit, not read


@dataclass(slots=True)
class Gathered:
    """Everything assembly reads, in full (what ``compose`` takes)."""

    system_prompt: str
    profile: list[MemoryHit]
    memories: list[MemoryHit]
    history: GatheredHistory
    procedures: list[ProcedureText] = field(default_factory=list)
    procedures_max_tokens: int = 0


_ORDER = SECTION_ORDER


class Composition:
    """The blocks of one assembly, built step by step in priority order, and their stats."""

    def __init__(self, s: Settled, policy: BudgetPolicy, max_summary_tokens: int) -> None:
        self.s = s
        self.stats = s.stats
        self.ledger = Ledger(s.plan)
        self.blocks: list[Block] = []
        self._policy = policy
        self._max_summary_tokens = max_summary_tokens
        self._next = 0  # index into _ORDER of the next step
        self._no_summary = Provenance.SUMMARY in s.req.omit
        self._history: tuple[HistoryPlan, int, list[Message], list[int], int] | None = None
        # What the profile block injected: the memory block never pays for (or shows) an item twice.
        self._in_profile: frozenset[str] = frozenset()  # ids and texts (``text_key``)
        # The range background summarization should take next (set by the history step), if any.
        self.summary_due: SummaryRange | None = None

    def _step(self, section: Section) -> None:
        if self._next >= len(_ORDER) or _ORDER[self._next] != section:
            raise AssertionError(f"assembly step {section.name} out of order")
        self._next += 1

    def _emit(self, section: Section, grant: int, block: Block) -> Block:
        self.ledger.spend(section, grant, block.token_count)
        return self._render_and_keep(block)

    def _render_and_keep(self, block: Block) -> Block:
        if self.s.req.render_text:
            block.rendered_text = render(block)
        self.blocks.append(block)
        return block

    def system(
        self,
        prompt: str,
        procedures: Sequence[ProcedureText] = (),
        procedures_max_tokens: int = 0,
        build: BuildProcedures = procedures_block,
    ) -> list[Block]:
        """The system section: the prompt, then the approved procedures within what the prompt left of
        the section's grant and their own cap; one spend for both (they share the grant)."""
        self._step(Section.SYSTEM)
        grant = self.ledger.grant(Section.SYSTEM)
        block = text_block(self.s.costing, Provenance.SYSTEM, prompt, grant)
        if block.truncated:
            removed = self.s.costing.message(prompt) - block.token_count
            self.stats.truncations.append(
                Truncation(Section.SYSTEM, "system prompt exceeds its cap", removed)
            )
        blocks = [block]
        if procedures:
            limit = max(0, min(procedures_max_tokens, grant - block.token_count))
            procs = build(self.s.costing, procedures, limit)
            if procs.truncated:
                self.stats.truncations.append(
                    Truncation(
                        Section.SYSTEM,
                        "procedures over their cap",
                        items_removed=len(procedures) - len(procs.procedures),
                    )
                )
            if procs.messages or procs.truncated:
                blocks.append(procs)
        self.ledger.spend(Section.SYSTEM, grant, sum(b.token_count for b in blocks))
        for b in blocks:
            self._render_and_keep(b)
        return blocks

    def hits(self, section: Section, hits: Sequence[MemoryHit]) -> Block:
        """The profile or the memory section."""
        self._step(section)
        provenance, heading = (
            (Provenance.PROFILE, PROFILE_HEADING)
            if section == Section.PROFILE
            else (Provenance.MEMORY, MEMORY_HEADING)
        )
        grant = self.ledger.grant(section)
        hits = self._distinct(section, hits)
        if section == Section.MEMORY:
            hits = self._not_in_profile(self._relevant(self._current(hits)))
        block = hits_block(self.s.costing, provenance, heading, hits, grant)
        if section == Section.PROFILE:
            shown = {m.memory_id for m in block.memories}
            self._in_profile = frozenset(shown | {text_key(h.text) for h in hits if h.memory_id in shown})
        if len(block.memories) < len(hits):
            shown = {m.memory_id for m in block.memories}
            self._left_out(section, "over the section cap", [h for h in hits if h.memory_id not in shown])
        return self._emit(section, grant, block)

    def _relevant(self, hits: Sequence[MemoryHit]) -> Sequence[MemoryHit]:
        """Recalled hits without the weak ones: matched by meaning alone (no word of the request), and
        far from it. Rank-fused scores cannot tell them (the best of a bad list scores as the best of a
        good one); the cosine can. A hit found through a named speaker's turns (expansion) is kept."""
        floor = self._policy.memory_min_similarity
        kept = [
            h
            for h in hits
            if h.parts is None
            or h.parts.keyword_rank
            or not h.parts.vector_rank
            or h.parts.vector_similarity >= floor
        ]
        if len(kept) < len(hits):
            self._left_out(Section.MEMORY, WEAK_HIT_REASON, [h for h in hits if h not in kept])
        return kept

    def _current(self, hits: Sequence[MemoryHit]) -> Sequence[MemoryHit]:
        """Recalled hits without the episodes whose fact was superseded (by any agent): shown beside the
        newer value, the older would be a second answer; it stays in search and in the history."""
        kept = [h for h in hits if not h.stale]
        if len(kept) < len(hits):
            self._left_out(Section.MEMORY, STALE_REASON, [h for h in hits if h.stale])
        return kept

    def _distinct(self, section: Section, hits: Sequence[MemoryHit]) -> Sequence[MemoryHit]:
        """Two memories with one text (one fact written by two agents, one turn stored twice) reach the
        model once: the first, best ranked; the trace names the rule."""
        first: dict[str, MemoryHit] = {}
        for h in hits:
            first.setdefault(text_key(h.text), h)
        out = list(first.values())
        if len(out) < len(hits):
            self._left_out(section, TEXT_REPEAT_REASON, [h for h in hits if first[text_key(h.text)] is not h])
        return out

    def _not_in_profile(self, hits: Sequence[MemoryHit]) -> Sequence[MemoryHit]:
        """Recalled hits minus those the profile block already holds, at most ``memory_limit`` of them.
        Recall is asked for ``memory_limit`` spares (``Gather.start``), so the slots and tokens a
        repeat would have taken go to the next hits; the trace names the rule and the repeats."""
        limit = self.s.req.memory_limit or self._policy.memory_limit
        fresh = [
            h
            for h in hits
            if h.memory_id not in self._in_profile and text_key(h.text) not in self._in_profile
        ]
        if len(fresh) < len(hits):
            self._left_out(Section.MEMORY, PROFILE_REPEAT_REASON, [h for h in hits if h not in fresh])
        return fresh[:limit]

    def _left_out(self, section: Section, reason: str, gone: Sequence[MemoryHit]) -> None:
        """A trace says which memories a rule left out, not only how many."""
        ids = [h.memory_id for h in gone]
        self.stats.truncations.append(Truncation(section, reason, items_removed=len(ids), memory_ids=ids))

    def history(self, read: GatheredHistory) -> GapFold | None:
        """Decides which turns go verbatim and which fold into a gap summary; returns the fold needed
        (then ``history_blocks`` takes its result) or None."""
        self._step(Section.HISTORY)
        s, req = self.s, self.s.req
        cands = read.readable
        # The input may already be stored as the last turn: then it is in the history, not extra.
        if s.input_tokens and cands and cands[-1].role == Role.USER and cands[-1].content == req.user_input:
            self.ledger.remaining += s.input_tokens
            if not req.caps.history:
                s.plan.caps[Section.HISTORY] = max(s.plan.caps[Section.HISTORY], self.ledger.remaining)
            s.plan.input_tokens = s.input_tokens = 0
        self.stats.input_tokens = s.input_tokens
        costs = [
            n + MESSAGE_OVERHEAD_TOKENS + s.costing.name_cost(m.participant_name)
            for m, n in zip(cands, read.content_tokens, strict=True)
        ]
        grant = self.ledger.grant(Section.HISTORY)
        summary = s.session.summary
        if self._no_summary:  # an A/B baseline (AssembleContextRequest.omit): the recent turns alone
            summary = Summary(through_message_id=summary.through_message_id, through_seq=summary.through_seq)
        elif s.strategy in SUMMARIZED:
            summary, cut = viewer_summary(
                summary, req.viewer, s.costing.counter, s.model, self.summary_budget(grant)
            )
            if cut:
                self.stats.truncations.append(
                    Truncation(Section.HISTORY, "summary parts cut to the summary budget")
                )
        hplan = select_history(
            s.strategy,
            summary,
            cands,
            costs,
            grant,
            policy=self._policy,
            summary_cost=s.costing.message(summary_content(summary.text, summary.through_seq))
            if summary.text
            else 0,
            window_turns=s.window_turns,
            unscanned=read.unscanned,
        )
        self._history = (hplan, grant, cands, costs, read.unscanned)
        if not hplan.gap or self._no_summary:
            return None
        through = hplan.gap[-1].seq
        previous = s.session.summary
        return GapFold(
            previous,
            [m for m in read.candidates if m.seq <= through],
            max(0, hplan.gap_summary_budget - SUMMARY_HEADING_TOKENS),
            store_all=previous.through_seq == 0,
        )

    def history_blocks(self, folded: Summary | None = None, *, stored: bool = False) -> tuple[Block, Block]:
        """The summary and conversation blocks; ``folded`` is the result of the ``GapFold`` asked for,
        ``stored`` whether it is now the session's stored summary."""
        assert self._history is not None, "history_blocks before history"
        hplan, grant, cands, costs, unscanned = self._history
        s = self.s
        if hplan.gap and not self._no_summary:
            if folded is None:
                raise AssertionError("the history needs its gap folded")
            budget = max(0, hplan.gap_summary_budget - SUMMARY_HEADING_TOKENS)
            shown, _ = viewer_summary(folded, s.req.viewer, s.costing.counter, s.model, budget)
            hplan.summary_text = shown.text
            hplan.summary_through_seq = hplan.gap[-1].seq
        summary_block, conversation = history_blocks(s.costing, hplan, grant)
        _history_stats(self.stats, hplan, summary_block)
        # Both history blocks share one grant: spend it in one go, then send them in order.
        self.ledger.spend(Section.HISTORY, grant, summary_block.token_count + conversation.token_count)
        for block in (summary_block, conversation):
            if s.req.render_text:
                block.rendered_text = render(block)
            self.blocks.append(block)
        if s.strategy in SUMMARIZED:
            through = folded.through_seq if folded is not None and stored else s.session.summary.through_seq
            self.summary_due = self._summary_due(
                cands, costs, stored=through, history_budget=grant, unscanned=unscanned
            )
        return summary_block, conversation

    def finish(self) -> AssembleStats:
        """Totals into the stats (the caller adds the elapsed time)."""
        if self._next != len(_ORDER):
            raise AssertionError("finish before every section was built")
        stats, plan = self.stats, self.s.plan
        stats.total_tokens = sum(b.token_count for b in self.blocks)
        stats.headroom_tokens = plan.window - plan.reserved_output - self.s.input_tokens - stats.total_tokens
        stats.budgets = self.ledger.budgets
        return stats

    def summary_budget(self, history_budget: int) -> int:
        """Content tokens a summary (one scope's, or one viewer's composed) may use."""
        share = int(history_budget * self._policy.summary_share)
        return max(1, min(self._max_summary_tokens, share) - SUMMARY_HEADING_TOKENS)

    def _summary_due(
        self, cands: list[Message], costs: list[int], *, stored: int, history_budget: int, unscanned: int
    ) -> SummaryRange | None:
        """The range to summarize in the background once the unsummarized turns reach the trigger
        (``stored``: the turn the stored summary covers through)."""
        p = self._policy
        pending = [(m, c) for m, c in zip(cands, costs, strict=True) if m.seq > stored]
        if not pending or (sum(c for _, c in pending) < p.trigger_ratio * history_budget and not unscanned):
            return None
        if self.s.strategy == Strategy.ROLLING_SUMMARY:
            keep = min(p.rolling_keep_turns, len(pending))
        else:
            target = p.hybrid_recent_share * history_budget
            keep, total = 0, 0
            for _, c in reversed(pending):
                if total + c > target:
                    break
                total += c
                keep += 1
        if keep >= len(pending):
            return None
        last = pending[len(pending) - keep - 1][0]
        return SummaryRange(stored, last.seq, last.message_id, self.summary_budget(history_budget))


def _history_stats(stats: AssembleStats, plan: HistoryPlan, summary_block: Block) -> None:
    stats.fallback = plan.fallback
    stats.dropped_message_count = plan.dropped
    stats.gap_message_count = len(plan.gap)
    stats.summary_behind = bool(plan.gap) or (
        plan.fallback == Fallback.DROPPED_OLDEST and plan.strategy in SUMMARIZED
    )
    if plan.gap:
        stats.truncations.append(
            Truncation(Section.HISTORY, "summary behind: turns folded into a gap summary", 0, len(plan.gap))
        )
    if plan.dropped:
        stats.truncations.append(
            Truncation(Section.HISTORY, "oldest turns do not fit the history budget", 0, plan.dropped)
        )
    if summary_block.truncated:
        stats.truncations.append(Truncation(Section.HISTORY, "summary cut to fit the history budget"))


@dataclass(slots=True)
class Composed:
    blocks: list[Block]
    stats: AssembleStats
    summary_due: SummaryRange | None = None
    gap: GapFold | None = None


def compose(
    s: Settled,
    inputs: Gathered,
    *,
    policy: BudgetPolicy,
    max_summary_tokens: int,
    fold_gap: Callable[[GapFold], Summary],
) -> Composed:
    """Every step of a ``Composition`` on inputs gathered in full: the blocks and stats assembly
    produces for them. ``fold_gap`` stands for the gap summarizer (pure in tests, extractive in the
    server, which runs it off the loop and may store its result)."""
    c = Composition(s, policy, max_summary_tokens)
    c.system(inputs.system_prompt, inputs.procedures, inputs.procedures_max_tokens)
    c.hits(Section.PROFILE, inputs.profile)
    c.hits(Section.MEMORY, inputs.memories)
    gap = c.history(inputs.history)
    c.history_blocks(fold_gap(gap) if gap is not None else None)
    return Composed(c.blocks, c.finish(), c.summary_due, gap)
