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
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import replace

from memlane_server.access.identity import Caller
from memlane_server.errors import InvalidArgument, NotFound
from memlane_server.sessions.model import Session, Summary
from memlane_server.sessions.policies import ChannelPolicy, PolicyBook
from memlane_server.sessions.store import SessionStore
from memlane_server.tokens import TokenCounter

from .budget import BudgetPolicy, Ledger, plan_budget, resolve_window
from .client_summary import submit_summary
from .compose import MEMORY_HEADING, PROFILE_HEADING, Costing, hits_block, render, text_block
from .history import INLINE_COUNT_CHARS, HistoryBuilder, ReadHistory, TurnState
from .model import AssembleRequest, AssembleStats, Block, Flush, Provenance, Section, Truncation, TurnTrace
from .sources import MemoryHit, MemorySource, NoMemory
from .strategy import resolve_strategy, resolve_window_turns
from .summarization import SummaryScheduler
from .traces import TraceStore, new_trace_id, now_ms

log = logging.getLogger("memlane.context")


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
        self._history = HistoryBuilder(
            store,
            counter,
            self._policy,
            scheduler=scheduler,
            max_summary_tokens=max_summary_tokens,
            executor=executor,
        )

    @property
    def policy(self) -> BudgetPolicy:
        return self._policy

    @property
    def traces(self) -> TraceStore:
        return self._traces

    def count_cache(self) -> tuple[int, int]:
        """(hits, misses) of turns' token counts: known without tokenizing vs tokenized now."""
        return self._history.count_hits, self._history.count_misses

    def forget(self, user_id: str, session_ids: set[str]) -> None:
        """Drops every cached copy of the user's data (erasure)."""
        self._history.forget(session_ids)
        self._memory.forget(user_id)

    # ------------------------------------------------------------------------------------- assembly

    async def _start(self, req: AssembleRequest, created: int) -> TurnState:
        """Reads the session and settles the request's model, window, strategy and budgets."""
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
        costing = Costing(self._counter, model)
        input_tokens = costing.message(req.user_input) if req.user_input else 0
        plan = plan_budget(window, reserved, input_tokens, req.caps, p)
        stats = AssembleStats(
            trace_id=new_trace_id(created),
            model=model,
            context_window=window,
            reserved_output=reserved,
            strategy=strategy,
            summary_through_seq=session.summary.through_seq,
        )
        window_turns = resolve_window_turns(req, channel, p.window_turns)
        return TurnState(
            req, session, model, strategy, window_turns, costing, plan, Ledger(plan), stats, input_tokens
        )

    async def _system_block(self, t: TurnState) -> tuple[Block, int]:
        system = t.req.system_prompt if t.req.system_prompt is not None else self._system_prompt
        grant = t.ledger.grant(Section.SYSTEM)
        if len(system) > INLINE_COUNT_CHARS:
            loop = asyncio.get_running_loop()
            block = await loop.run_in_executor(
                self._executor, text_block, t.costing, Provenance.SYSTEM, system, grant
            )
        else:
            block = text_block(t.costing, Provenance.SYSTEM, system, grant)
        if block.truncated:
            removed = t.costing.message(system) - block.token_count
            t.stats.truncations.append(Truncation(Section.SYSTEM, "system prompt exceeds its cap", removed))
        return block, grant

    def _start_reads(
        self, t: TurnState
    ) -> tuple[asyncio.Task[list[MemoryHit]], asyncio.Task[list[MemoryHit]], asyncio.Task[ReadHistory]]:
        """Profile, recall and the history read, as tasks."""
        session, req = t.session, t.req
        viewer = req.viewer
        if viewer.unrestricted and session.agent_id:
            # No caller identity (auth off, no agent header): the session's own agent is the viewer.
            viewer = replace(viewer, agent_id=session.agent_id)
        limit = req.memory_limit or self._policy.memory_limit
        return (
            asyncio.create_task(
                self._memory.profile(session.user_id, viewer, t.plan.caps[Section.PROFILE])
                if Provenance.PROFILE not in req.omit
                else _nothing()
            ),
            asyncio.create_task(
                self._memory.recall(session.user_id, viewer, req.user_input, limit, session.channel)
                if req.user_input and Provenance.MEMORY not in req.omit
                else _nothing()
            ),
            asyncio.create_task(self._history.read(session, t.strategy, t.window_turns, req.viewer)),
        )

    async def assemble(self, req: AssembleRequest) -> AsyncIterator[Flush]:
        """Yields the system, profile, memory, summary and conversation blocks, in that order, batched
        into flushes: a flush goes out when the next section is not ready yet, so a slow section never
        holds back the ones before it, and sections that are ready together travel in one response
        (each response costs a round trip's worth of gRPC work). The last flush carries the stats."""
        started = time.perf_counter()
        created = now_ms()
        t = await self._start(req, created)
        stats, ledger = t.stats, t.ledger
        blocks: list[Block] = []

        # Retrieval and the history read start now and overlap the blocks sent before them.
        profile_task, recall_task, history_task = self._start_reads(t)
        tasks = (profile_task, recall_task, history_task)
        try:
            block, grant = await self._system_block(t)
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
                block = hits_block(t.costing, provenance, heading, hits, grant)
                if len(block.memories) < len(hits):
                    removed = len(hits) - len(block.memories)
                    stats.truncations.append(
                        Truncation(section, "over the section cap", items_removed=removed)
                    )
                ready.append(
                    self._emit(req, ledger, section=section, grant=grant, block=block, blocks=blocks)
                )

            if not history_task.done() and ready:
                yield Flush(ready)
                ready = []
            summary_block, conversation, grant = await self._history.build(t, await history_task)
            # Both history blocks share one grant; spend it in one go, then send them in order.
            ledger.spend(Section.HISTORY, grant, summary_block.token_count + conversation.token_count)
            for block in (summary_block, conversation):
                if req.render_text:
                    block.rendered_text = render(block)
                blocks.append(block)
            await self._finish(t, blocks, started, created)
            yield Flush([*ready, summary_block, conversation], stats)
        finally:
            for running in tasks:
                running.cancel()
            for running in tasks:
                with contextlib.suppress(BaseException):
                    await running

    async def _finish(self, t: TurnState, blocks: list[Block], started: float, created: int) -> None:
        """Totals into the stats, and the trace stored: the stats (with the trace id) go out only after,
        so a GetTurnTrace right after the stream always finds it."""
        stats = t.stats
        stats.total_tokens = sum(b.token_count for b in blocks)
        stats.headroom_tokens = t.plan.window - t.plan.reserved_output - t.input_tokens - stats.total_tokens
        stats.budgets = t.ledger.budgets
        stats.elapsed_us = int((time.perf_counter() - started) * 1e6)
        await self._traces.put(TurnTrace(stats.trace_id, t.session.session_id, created, t.req, blocks, stats))

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

    async def submit_summary(
        self, session_id: str, text: str, after_seq: int, through_seq: int, through_message_id: str
    ) -> Summary:
        return await submit_summary(
            self._store,
            self._history,
            self._max_summary_tokens,
            session_id=session_id,
            text=text,
            after_seq=after_seq,
            through_seq=through_seq,
            through_message_id=through_message_id,
        )

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
