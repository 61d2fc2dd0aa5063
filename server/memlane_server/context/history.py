"""The history section of one assembly: the turns read, the viewer's summary, what fits, what is folded.

Turns after the stored summary are read (``RecentTurns``), filtered to what the viewer may read, costed
in the request's encoding and fitted by ``select_history``. The summary shown is the viewer's own
(``viewer_summary``); when the stored one is behind, the uncovered turns are folded in per scope with a
fast extractive summarizer, and once enough turns are pending a background summarization is scheduled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from concurrent.futures import Executor
from dataclasses import dataclass, replace

from memlane_server.access.identity import Caller
from memlane_server.errors import Conflict
from memlane_server.sessions.model import Message, Role, Session, Summary
from memlane_server.sessions.store import SessionStore
from memlane_server.summarizers import ExtractiveSummarizer
from memlane_server.summarizers.scoped import Scope, fold_scoped
from memlane_server.tokens import MESSAGE_OVERHEAD_TOKENS, TokenCounter, encoding_for_model

from .budget import BudgetPlan, BudgetPolicy, Ledger
from .compose import Costing, HistoryPlan, history_blocks, select_history, summary_content
from .model import (
    AssembleRequest,
    AssembleStats,
    Block,
    Fallback,
    Provenance,
    Section,
    Strategy,
    SummaryRange,
    Truncation,
)
from .recent import RecentTurns
from .summarization import SummaryScheduler
from .traces import now_ms
from .viewer_summary import can_read, viewer_summary

# Tokenizing more text than this inline would stall the event loop noticeably (about 40 us per 200
# characters); beyond it, counting moves to the executor.
INLINE_COUNT_CHARS = 16_000
# Token counts of messages in an encoding other than their session's, kept across requests.
_RECOUNT_CACHE_SIZE = 100_000
# Room the summary block's own heading takes, kept out of the summary's content budget.
SUMMARY_HEADING_TOKENS = 24
_SUMMARIZED = (Strategy.HYBRID, Strategy.ROLLING_SUMMARY)


@dataclass(slots=True)
class TurnState:
    """One assembly's settled choices and running accounts."""

    req: AssembleRequest
    session: Session
    model: str
    strategy: Strategy
    window_turns: int
    costing: Costing
    plan: BudgetPlan
    ledger: Ledger
    stats: AssembleStats
    input_tokens: int


@dataclass(slots=True)
class ReadHistory:
    candidates: list[Message]  # every stored turn read (all visibilities), oldest first
    unscanned: int  # older turns beyond the scan limit, not read


class HistoryBuilder:
    def __init__(
        self,
        store: SessionStore,
        counter: TokenCounter,
        policy: BudgetPolicy,
        *,
        scheduler: SummaryScheduler | None,
        max_summary_tokens: int,
        executor: Executor | None,
    ) -> None:
        self._store = store
        self._counter = counter
        self._policy = policy
        self._scheduler = scheduler
        self._max_summary_tokens = max_summary_tokens
        self._executor = executor
        self.gap_summarizer = ExtractiveSummarizer(counter, executor=executor)
        self._recent = RecentTurns(store)
        self._recounts: OrderedDict[tuple[str, str, str], int] = OrderedDict()
        # Token counts of turns: a hit is a count known without tokenizing (stored with the message in
        # the session's encoding, or recounted earlier), a miss one tokenized now. Read by metrics.
        self.count_hits = 0
        self.count_misses = 0

    def forget(self, session_ids: set[str]) -> None:
        self._recent.forget(session_ids)
        for key in [k for k in self._recounts if k[0] in session_ids]:
            del self._recounts[key]

    async def count(self, texts: list[str], model: str) -> list[int]:
        if sum(len(t) for t in texts) <= INLINE_COUNT_CHARS:
            return self._counter.count_many(texts, model)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._counter.count_many, texts, model)

    async def read(
        self, session: Session, strategy: Strategy, window_turns: int, viewer: Caller
    ) -> ReadHistory:
        p = self._policy
        sid = session.session_id
        if not session.last_seq:
            return ReadHistory([], 0)
        if strategy == Strategy.SLIDING_WINDOW:
            return ReadHistory(await self._window(sid, max(1, window_turns), viewer), 0)
        after = session.summary.through_seq if strategy in _SUMMARIZED else 0
        pending = max(0, session.last_seq - after)
        if pending == 0:
            return ReadHistory([], 0)
        msgs = await self._recent.after(session, after, min(pending, p.max_scan_messages))
        return ReadHistory(msgs, max(0, pending - p.max_scan_messages))

    async def _window(self, session_id: str, turns: int, viewer: Caller) -> list[Message]:
        """The stored turns holding the viewer's last ``turns`` readable ones: in a distributed session
        the newest turns may all be other agents' private ones, so the read widens (4x a step, up to
        ``max_scan_messages``) until it holds enough or the session has no more."""
        limit = self._policy.max_scan_messages
        n = turns
        while True:
            msgs = await self._store.tail(session_id, n)
            seen = sum(1 for m in msgs if viewer.can_see(m.visibility, m.source_agent_id, m.visibility_group))
            if seen >= turns or len(msgs) < n or n >= limit:
                return msgs
            n = min(limit, n * 4)

    async def _message_costs(self, t: TurnState, msgs: list[Message]) -> list[int]:
        # Stored counts were made in the session's encoding; reuse them when the request's matches.
        # Otherwise count once per (message, encoding) and remember: a model that differs from the
        # session's would else recount the whole history on every request.
        encoding = encoding_for_model(t.model, self._counter.default_encoding)
        same = encoding == encoding_for_model(t.session.model, self._counter.default_encoding)
        sid = t.session.session_id
        known: dict[int, int] = {}
        todo: list[int] = []
        for i, m in enumerate(msgs):
            if same and (m.token_count or not m.content):
                known[i] = m.token_count
            elif (hit := self._recounts.get((sid, m.message_id, encoding))) is not None:
                known[i] = hit
            else:
                todo.append(i)
        self.count_hits += len(known)
        self.count_misses += len(todo)
        if todo:
            for i, n in zip(todo, await self.count([msgs[i].content for i in todo], t.model), strict=True):
                known[i] = n
                self._recounts[(sid, msgs[i].message_id, encoding)] = n
            while len(self._recounts) > _RECOUNT_CACHE_SIZE:
                self._recounts.popitem(last=False)
        return [
            known[i] + MESSAGE_OVERHEAD_TOKENS + t.costing.name_cost(m.participant_name)
            for i, m in enumerate(msgs)
        ]

    def _summary_budget(self, history_budget: int) -> int:
        """Content tokens a summary (one scope's, or one viewer's composed) may use."""
        share = int(history_budget * self._policy.summary_share)
        return max(1, min(self._max_summary_tokens, share) - SUMMARY_HEADING_TOKENS)

    async def build(self, t: TurnState, history: ReadHistory) -> tuple[Block, Block, int]:
        """The summary and conversation blocks within the history grant (returned too, unspent)."""
        req, p = t.req, self._policy
        # Another agent's private turns or a foreign group's never reach this context.
        cands = [
            m
            for m in history.candidates
            if req.viewer.can_see(m.visibility, m.source_agent_id, m.visibility_group)
        ]
        # The input may already be stored as the last turn: then it is in the history, not extra.
        if t.input_tokens and cands and cands[-1].role == Role.USER and cands[-1].content == req.user_input:
            t.ledger.remaining += t.input_tokens
            if not req.caps.history:
                t.plan.caps[Section.HISTORY] = max(t.plan.caps[Section.HISTORY], t.ledger.remaining)
            t.plan.input_tokens = t.input_tokens = 0
        t.stats.input_tokens = t.input_tokens
        costs = await self._message_costs(t, cands)
        grant = t.ledger.grant(Section.HISTORY)
        summary = t.session.summary
        no_summary = Provenance.SUMMARY in req.omit  # an A/B baseline: the recent turns alone
        if no_summary:
            summary = Summary(through_message_id=summary.through_message_id, through_seq=summary.through_seq)
        elif t.strategy in _SUMMARIZED:
            summary, cut = viewer_summary(
                summary, req.viewer, self._counter, t.model, self._summary_budget(grant)
            )
            if cut:
                t.stats.truncations.append(
                    Truncation(Section.HISTORY, "summary parts cut to the summary budget")
                )
        hplan = select_history(
            t.strategy,
            summary,
            cands,
            costs,
            grant,
            policy=p,
            summary_cost=t.costing.message(summary_content(summary.text, summary.through_seq))
            if summary.text
            else 0,
            window_turns=t.window_turns,
            unscanned=history.unscanned,
        )
        if hplan.gap and not no_summary:
            await self._fold_gap(t, hplan, history.candidates)
        summary_block, conversation = history_blocks(t.costing, hplan, grant)
        _history_stats(t.stats, hplan, summary_block)
        if t.strategy in _SUMMARIZED:
            self._maybe_summarize(t, cands, costs, history_budget=grant, unscanned=history.unscanned)
        return summary_block, conversation, grant

    async def _fold_gap(self, t: TurnState, plan: HistoryPlan, read: list[Message]) -> None:
        """Fallback: a fast extractive summary of the turns the stored summary does not cover yet.

        Folded per scope like any summary; only the viewer's scopes are shown. A session without any
        summary (a resumption) stores the fold of every scope, so the next request starts from it."""
        session, viewer = t.session, t.req.viewer
        budget = max(0, plan.gap_summary_budget - SUMMARY_HEADING_TOKENS)
        through = plan.gap[-1].seq
        leaving = [m for m in read if m.seq <= through]
        prev = session.summary
        store = prev.through_seq == 0

        def readable(scope: Scope) -> bool:
            return can_read(viewer, scope)

        folded = await fold_scoped(
            self.gap_summarizer, prev, leaving, budget, keep=None if store else readable
        )
        shown, _ = viewer_summary(folded, viewer, self._counter, t.model, budget)
        plan.summary_text = shown.text
        plan.summary_through_seq = through
        if store and (folded.text or folded.scoped):
            # Losing the race to another writer (the background run, a client) is fine.
            new = replace(folded, updated_at_ms=now_ms())
            with contextlib.suppress(Conflict):
                await self._store.set_summary(session.session_id, new, expected_through_seq=0)
                session.summary = new

    def _maybe_summarize(
        self, t: TurnState, cands: list[Message], costs: list[int], *, history_budget: int, unscanned: int
    ) -> None:
        """Starts a background summarization once the unsummarized turns reach the trigger ratio."""
        p = self._policy
        stored = t.session.summary.through_seq
        pending = [(m, c) for m, c in zip(cands, costs, strict=True) if m.seq > stored]
        if not pending or (sum(c for _, c in pending) < p.trigger_ratio * history_budget and not unscanned):
            return
        if t.strategy == Strategy.ROLLING_SUMMARY:
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
            return
        last = pending[len(pending) - keep - 1][0]
        rng = SummaryRange(stored, last.seq, last.message_id, self._summary_budget(history_budget))
        if self._scheduler is None:
            t.stats.summary_request = rng
        else:
            t.stats.summarization_scheduled = self._scheduler.schedule(t.session.session_id, rng)


def _history_stats(stats: AssembleStats, plan: HistoryPlan, summary_block: Block) -> None:
    stats.fallback = plan.fallback
    stats.dropped_message_count = plan.dropped
    stats.gap_message_count = len(plan.gap)
    stats.summary_behind = bool(plan.gap) or (
        plan.fallback == Fallback.DROPPED_OLDEST and plan.strategy in _SUMMARIZED
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
