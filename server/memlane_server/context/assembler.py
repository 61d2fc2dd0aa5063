"""Working-memory assembly: per request, exactly what the model sees, streamed section by section.

The system block goes out at once while profile, recall and the history read run concurrently; each
later block is sent as soon as it and everything before it is ready. Budgets are granted in priority
order by a ``Ledger`` (see ``budget``), so the headroom invariant holds whatever the sections return.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, replace

from memlane_server.access.identity import Caller
from memlane_server.errors import Conflict, InvalidArgument, NotFound, ResourceExhausted
from memlane_server.sessions.model import Message, Role, Session, Summary, VisibilityKind
from memlane_server.sessions.policies import ChannelPolicy, PolicyBook
from memlane_server.sessions.store import SessionStore
from memlane_server.summarizers import ExtractiveSummarizer
from memlane_server.tokens import MESSAGE_OVERHEAD_TOKENS, TokenCounter, encoding_for_model

from .budget import BudgetPolicy, Ledger, plan_budget, resolve_window
from .compose import (
    MEMORY_HEADING,
    PROFILE_HEADING,
    Costing,
    HistoryPlan,
    history_blocks,
    hits_block,
    render,
    select_history,
    summary_content,
    text_block,
)
from .model import (
    AssembleRequest,
    AssembleStats,
    Block,
    Fallback,
    Flush,
    Provenance,
    Section,
    Strategy,
    SummaryRange,
    Truncation,
    TurnTrace,
)
from .recent import RecentTurns
from .sources import MemoryHit, MemorySource, NoMemory
from .strategy import resolve_strategy, resolve_window_turns
from .summarization import SummaryScheduler, summarizable
from .traces import TraceStore, new_trace_id, now_ms

log = logging.getLogger("memlane.context")

# Tokenizing more text than this inline would stall the event loop noticeably (about 40 us per 200
# characters); beyond it, counting moves to the executor.
INLINE_COUNT_CHARS = 16_000
# Token counts of messages in an encoding other than their session's, kept across requests.
_RECOUNT_CACHE_SIZE = 100_000
# Room the summary block's own heading takes, kept out of the summary's content budget.
SUMMARY_HEADING_TOKENS = 24


@dataclass(slots=True)
class _History:
    candidates: list[Message]
    unscanned: int


class ContextAssembler:
    """Assembles context, accepts client summaries and serves turn traces.

    ``scheduler`` runs server-side summarization (extractive or openai); None means the ``client``
    provider: assembly then reports the range that needs a summary and waits for ``submit_summary``.
    ``memory`` is the long-term memory source (``NoMemory`` leaves the profile and memory sections empty).
    """

    def __init__(
        self,
        store: SessionStore,
        traces: TraceStore,
        counter: TokenCounter,
        *,
        memory: MemorySource | None = None,
        scheduler: SummaryScheduler | None = None,
        policy: BudgetPolicy | None = None,
        system_prompt: str = "",
        default_model: str = "",
        max_summary_tokens: int = 8192,
        executor: Executor | None = None,
        resume: Callable[[Session], Awaitable[bool]] | None = None,
        policies: PolicyBook | None = None,
    ) -> None:
        self._store = store
        # Channel policies (recorded on each session at creation) choose strategy and window per channel.
        self._policies = policies or PolicyBook(ChannelPolicy())
        # Reloads a retired session's recent turns from the archive; True when it did (re-read then).
        self._resume = resume
        self._traces = traces
        self._counter = counter
        self._memory: MemorySource = memory or NoMemory()
        self._scheduler = scheduler
        self._policy = policy or BudgetPolicy()
        self._system_prompt = system_prompt
        self._default_model = default_model
        self._max_summary_tokens = max_summary_tokens
        self._executor = executor
        self._gap = ExtractiveSummarizer(counter, executor=executor)
        self._recent = RecentTurns(store)
        self._recounts: OrderedDict[tuple[str, str, str], int] = OrderedDict()

    @property
    def policy(self) -> BudgetPolicy:
        return self._policy

    @property
    def traces(self) -> TraceStore:
        return self._traces

    def forget(self, user_id: str, session_ids: set[str]) -> None:
        """Drops every cached copy of the user's data (erasure)."""
        self._recent.forget(session_ids)
        self._memory.forget(user_id)

    # ------------------------------------------------------------------------------------- assembly

    async def _count(self, texts: list[str], model: str) -> list[int]:
        if sum(len(t) for t in texts) <= INLINE_COUNT_CHARS:
            return self._counter.count_many(texts, model)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._counter.count_many, texts, model)

    async def _read_history(self, session: Session, strategy: Strategy, window_turns: int) -> _History:
        p = self._policy
        sid = session.session_id
        if not session.last_seq:
            return _History([], 0)
        if strategy == Strategy.SLIDING_WINDOW:
            return _History(await self._store.tail(sid, max(1, window_turns)), 0)
        after = session.summary.through_seq if strategy in (Strategy.HYBRID, Strategy.ROLLING_SUMMARY) else 0
        pending = max(0, session.last_seq - after)
        if pending == 0:
            return _History([], 0)
        msgs = await self._recent.after(session, after, min(pending, p.max_scan_messages))
        return _History(msgs, max(0, pending - p.max_scan_messages))

    async def _message_costs(
        self, costing: Costing, msgs: list[Message], model: str, session: Session
    ) -> list[int]:
        # Stored counts were made in the session's encoding; reuse them when the request's matches.
        # Otherwise count once per (message, encoding) and remember: a model that differs from the
        # session's would else recount the whole history on every request.
        encoding = encoding_for_model(model, self._counter.default_encoding)
        same = encoding == encoding_for_model(session.model, self._counter.default_encoding)
        sid = session.session_id
        known: dict[int, int] = {}
        todo: list[int] = []
        for i, m in enumerate(msgs):
            if same and (m.token_count or not m.content):
                known[i] = m.token_count
            elif (hit := self._recounts.get((sid, m.message_id, encoding))) is not None:
                known[i] = hit
            else:
                todo.append(i)
        if todo:
            for i, n in zip(todo, await self._count([msgs[i].content for i in todo], model), strict=True):
                known[i] = n
                self._recounts[(sid, msgs[i].message_id, encoding)] = n
            while len(self._recounts) > _RECOUNT_CACHE_SIZE:
                self._recounts.popitem(last=False)
        return [
            known[i] + MESSAGE_OVERHEAD_TOKENS + costing.name_cost(m.participant_name)
            for i, m in enumerate(msgs)
        ]

    async def assemble(self, req: AssembleRequest) -> AsyncIterator[Flush]:
        """Yields the system, profile, memory, summary and conversation blocks, in that order, batched
        into flushes: a flush goes out when the next section is not ready yet, so a slow section never
        holds back the ones before it, and sections that are ready together travel in one response
        (each response costs a round trip's worth of gRPC work). The last flush carries the stats."""
        started = time.perf_counter()
        created = now_ms()
        if not req.session_id:
            raise InvalidArgument("session_id is required")
        if req.window_turns < 0 or req.memory_limit < 0:
            raise InvalidArgument("window_turns and memory_limit must not be negative")
        session = await self._store.get(req.session_id)
        if self._resume is not None and await self._resume(session):
            session = await self._store.get(req.session_id)
        p = self._policy
        model = req.model or session.model or self._default_model
        window = resolve_window(model, req.context_window)
        reserved = req.reserved_output or min(p.default_reserved_output, window // 4)
        channel = self._policies.for_session(session)
        strategy = resolve_strategy(req, session.metadata, channel, p.default_strategy)
        window_turns = resolve_window_turns(req, channel, p.window_turns)
        costing = Costing(self._counter, model)
        input_tokens = costing.message(req.user_input) if req.user_input else 0
        plan = plan_budget(window, reserved, input_tokens, req.caps, p)
        ledger = Ledger(plan)
        stats = AssembleStats(
            trace_id=new_trace_id(created),
            model=model,
            context_window=window,
            reserved_output=reserved,
            strategy=strategy,
            summary_through_seq=session.summary.through_seq,
        )
        blocks: list[Block] = []

        # Retrieval and the history read start now and overlap the blocks sent before them.
        viewer = req.viewer
        if viewer.unrestricted and session.agent_id:
            # No caller identity (auth off, no agent header): the session's own agent is the viewer.
            viewer = replace(viewer, agent_id=session.agent_id)
        profile_task = asyncio.create_task(
            self._memory.profile(session.user_id, viewer, plan.caps[Section.PROFILE])
        )
        recall_task = asyncio.create_task(
            self._memory.recall(
                session.user_id, viewer, req.user_input, req.memory_limit or p.memory_limit, session.channel
            )
            if req.user_input
            else _nothing()
        )
        history_task = asyncio.create_task(self._read_history(session, strategy, window_turns))
        tasks = (profile_task, recall_task, history_task)
        try:
            system = req.system_prompt if req.system_prompt is not None else self._system_prompt
            grant = ledger.grant(Section.SYSTEM)
            if len(system) > INLINE_COUNT_CHARS:
                loop = asyncio.get_running_loop()
                block = await loop.run_in_executor(
                    self._executor, text_block, costing, Provenance.SYSTEM, system, grant
                )
            else:
                block = text_block(costing, Provenance.SYSTEM, system, grant)
            if block.truncated:
                removed = costing.message(system) - block.token_count
                stats.truncations.append(Truncation(Section.SYSTEM, "system prompt exceeds its cap", removed))
            ready = [self._emit(req, ledger, section=Section.SYSTEM, grant=grant, block=block, blocks=blocks)]
            # One turn of the loop lets retrieval that needs no I/O (a cached profile, no LTM) finish
            # and share the first response.
            await asyncio.sleep(0)

            for section, task, provenance, heading in (
                (Section.PROFILE, profile_task, Provenance.PROFILE, PROFILE_HEADING),
                (Section.MEMORY, recall_task, Provenance.MEMORY, MEMORY_HEADING),
            ):
                if not task.done():
                    yield Flush(ready)
                    ready = []
                hits = await task
                grant = ledger.grant(section)
                block = hits_block(costing, provenance, heading, hits, grant)
                if len(block.memories) < len(hits):
                    stats.truncations.append(
                        Truncation(
                            section, "over the section cap", items_removed=len(hits) - len(block.memories)
                        )
                    )
                ready.append(
                    self._emit(req, ledger, section=section, grant=grant, block=block, blocks=blocks)
                )

            if not history_task.done() and ready:
                yield Flush(ready)
                ready = []
            history = await history_task
            # Another agent's private turns or a foreign group's never reach this context.
            cands = [
                m
                for m in history.candidates
                if m.visibility == VisibilityKind.SESSION
                or req.viewer.can_see(m.visibility, m.source_agent_id, m.visibility_group)
            ]
            # The input may already be stored as the last turn: then it is in the history, not extra.
            if input_tokens and cands and cands[-1].role == Role.USER and cands[-1].content == req.user_input:
                ledger.remaining += input_tokens
                if not req.caps.history:
                    plan.caps[Section.HISTORY] = max(plan.caps[Section.HISTORY], ledger.remaining)
                plan.input_tokens = input_tokens = 0
            stats.input_tokens = input_tokens
            costs = await self._message_costs(costing, cands, model, session)
            grant = ledger.grant(Section.HISTORY)
            summary = session.summary
            hplan = select_history(
                strategy,
                summary,
                cands,
                costs,
                grant,
                policy=p,
                summary_cost=costing.message(summary_content(summary.text, summary.through_seq))
                if summary.text
                else 0,
                window_turns=window_turns,
                unscanned=history.unscanned,
            )
            if hplan.gap:
                await self._fold_gap(session, hplan)
            summary_block, conversation = history_blocks(costing, hplan, grant)
            self._history_stats(stats, hplan, summary_block)
            if strategy in (Strategy.HYBRID, Strategy.ROLLING_SUMMARY):
                self._maybe_summarize(
                    session,
                    strategy,
                    cands,
                    costs,
                    history_budget=grant,
                    unscanned=history.unscanned,
                    stats=stats,
                )
            # Both history blocks share one grant; spend it in one go, then send them in order.
            ledger.spend(Section.HISTORY, grant, summary_block.token_count + conversation.token_count)
            for block in (summary_block, conversation):
                if req.render_text:
                    block.rendered_text = render(block)
                blocks.append(block)
            stats.total_tokens = sum(b.token_count for b in blocks)
            stats.headroom_tokens = window - reserved - input_tokens - stats.total_tokens
            stats.budgets = ledger.budgets
            stats.elapsed_us = int((time.perf_counter() - started) * 1e6)
            # Stats (with the trace id) go out once the trace is stored, so a GetTurnTrace right after the
            # stream always finds it.
            await self._traces.put(TurnTrace(stats.trace_id, session.session_id, created, req, blocks, stats))
            yield Flush([*ready, summary_block, conversation], stats)
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(BaseException):
                    await t

    def _emit(
        self,
        req: AssembleRequest,
        ledger: Ledger,
        *,
        section: Section,
        grant: int,
        block: Block,
        blocks: list[Block],
    ) -> Block:
        ledger.spend(section, grant, block.token_count)
        if req.render_text:
            block.rendered_text = render(block)
        blocks.append(block)
        return block

    @staticmethod
    def _history_stats(stats: AssembleStats, plan: HistoryPlan, summary_block: Block) -> None:
        stats.fallback = plan.fallback
        stats.dropped_message_count = plan.dropped
        stats.gap_message_count = len(plan.gap)
        stats.summary_behind = bool(plan.gap) or (
            plan.fallback == Fallback.DROPPED_OLDEST
            and plan.strategy in (Strategy.HYBRID, Strategy.ROLLING_SUMMARY)
        )
        if plan.gap:
            stats.truncations.append(
                Truncation(
                    Section.HISTORY, "summary behind: turns folded into a gap summary", 0, len(plan.gap)
                )
            )
        if plan.dropped:
            stats.truncations.append(
                Truncation(Section.HISTORY, "oldest turns do not fit the history budget", 0, plan.dropped)
            )
        if summary_block.truncated:
            stats.truncations.append(Truncation(Section.HISTORY, "summary cut to fit the history budget"))

    async def _fold_gap(self, session: Session, plan: HistoryPlan) -> None:
        """Fallback: a fast extractive summary of the turns the stored summary does not cover yet."""
        budget = max(0, plan.gap_summary_budget - SUMMARY_HEADING_TOKENS)
        result = await self._gap.summarize(plan.summary_text, summarizable(plan.gap), budget)
        prev = session.summary
        plan.summary_text = result.text
        plan.summary_through_seq = plan.gap[-1].seq
        if prev.through_seq == 0 and result.text:
            # Resumption: a session without a summary gets one before (not instead of) the background
            # run, so the next request starts from it. Losing the race to another writer is fine.
            new = Summary(
                result.text, plan.gap[-1].message_id, plan.gap[-1].seq, result.token_count, now_ms()
            )
            with contextlib.suppress(Conflict):
                await self._store.set_summary(session.session_id, new, expected_through_seq=0)
                session.summary = new

    def _maybe_summarize(
        self,
        session: Session,
        strategy: Strategy,
        cands: list[Message],
        costs: list[int],
        *,
        history_budget: int,
        unscanned: int,
        stats: AssembleStats,
    ) -> None:
        """Starts a background summarization once the unsummarized turns reach the trigger ratio."""
        p = self._policy
        stored = session.summary.through_seq
        pending = [(m, c) for m, c in zip(cands, costs, strict=True) if m.seq > stored]
        if not pending or (sum(c for _, c in pending) < p.trigger_ratio * history_budget and not unscanned):
            return
        if strategy == Strategy.ROLLING_SUMMARY:
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
        budget = min(self._max_summary_tokens, int(history_budget * p.summary_share)) - SUMMARY_HEADING_TOKENS
        rng = SummaryRange(stored, last.seq, last.message_id, max(1, budget))
        if self._scheduler is None:
            stats.summary_request = rng
        else:
            stats.summarization_scheduled = self._scheduler.schedule(session.session_id, rng)

    # ------------------------------------------------------------------------------ client summaries

    async def submit_summary(
        self, session_id: str, text: str, after_seq: int, through_seq: int, through_message_id: str
    ) -> Summary:
        if not session_id:
            raise InvalidArgument("session_id is required")
        if not text.strip():
            raise InvalidArgument("text is required")
        if after_seq < 0 or through_seq <= after_seq:
            raise InvalidArgument("through_seq must be greater than after_seq (and after_seq >= 0)")
        if not through_message_id:
            raise InvalidArgument("through_message_id is required")
        session = await self._store.get(session_id)
        stored = session.summary
        if (
            stored.through_seq == through_seq
            and stored.through_message_id == through_message_id
            and stored.text == text
        ):
            return stored  # a retry of a submission that already landed
        if stored.through_seq != after_seq:
            raise Conflict(
                f"stale summary: it continues turn {after_seq} but the stored summary covers through "
                f"turn {stored.through_seq}; summarize from there"
            )
        if through_seq > session.last_seq:
            raise InvalidArgument(
                f"through_seq {through_seq} is beyond the session's last turn {session.last_seq}"
            )
        at = await self._store.range_by_seq(session_id, through_seq - 1, through_seq, 1)
        if not at or at[0].message_id != through_message_id:
            raise InvalidArgument(
                f"through_message_id {through_message_id!r} is not the turn at seq {through_seq}"
            )
        tokens = (await self._count([text], session.model))[0]
        if tokens > self._max_summary_tokens:
            raise ResourceExhausted(f"summary has {tokens} tokens; the limit is {self._max_summary_tokens}")
        new = Summary(text, through_message_id, through_seq, tokens, now_ms())
        await self._store.set_summary(session_id, new, expected_through_seq=after_seq)
        return new

    # ---------------------------------------------------------------------------------------- traces

    # A trace holds what one caller's model saw, private turns included: only that caller, an auditor,
    # or an orchestrator reading for it may replay it. Others get NOT_FOUND / a filtered page.

    async def get_trace(self, session_id: str, trace_id: str, viewer: Caller) -> TurnTrace:
        trace = await self._traces.get(session_id, trace_id)
        if not viewer.reads_for(trace.request.viewer.agent_id):
            raise NotFound(f"trace {trace_id!r} not found in session {session_id!r}")
        return trace

    async def list_traces(
        self, viewer: Caller, session_id: str, page_size: int, page_token: str
    ) -> tuple[list[TurnTrace], str]:
        if not session_id:
            raise InvalidArgument("session_id is required")
        await self._store.get(session_id)  # NOT_FOUND for an unknown session, not an empty page
        traces, token = await self._traces.list(session_id, page_size, page_token)
        return [t for t in traces if viewer.reads_for(t.request.viewer.agent_id)], token

    async def aclose(self) -> None:
        if self._scheduler is not None:
            await self._scheduler.aclose()


async def _nothing() -> list[MemoryHit]:
    return []
