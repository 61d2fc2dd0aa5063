"""Working-memory assembly: per request, exactly what the model sees, streamed section by section.

Gathering (``gather``: the session, then profile, recall and the history read, concurrently) feeds the
pure core (``core``: blocks and stats within the budgets). The system block goes out at once; each
later block is sent as soon as it and everything before it is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor

from ..access.identity import Caller
from ..observability import spans
from ..sessions.model import ChannelPolicy, PolicyBook, Session, Summary
from ..sessions.store import SessionStore
from ..summarizers import ExtractiveSummarizer
from ..tokens import TokenCounter
from .budget import BudgetPolicy
from .compose import ProcedureBlocks, procedures_block
from .core import Composition, GatheredHistory, settle
from .gather import Gatherer
from .history import INLINE_COUNT_CHARS, HistoryReader, TurnMemo
from .model import AssembleRequest, Block, Flush, Section, TurnTrace
from .sources import MemorySource, NoMemory, NoProcedures, ProcedureSource, ProcedureText
from .summaries import SummaryScheduler, fold_gap, submit_summary
from .traces import TraceStore, TurnTraces, new_trace_id, now_ms

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
        policy: BudgetPolicy,
        system_prompt: str = "",
        default_model: str = "",
        max_summary_tokens: int,  # from the settings (wiring/), as procedures_max_tokens
        executor: Executor | None = None,
        resume: Callable[[Session], Awaitable[bool]] | None = None,
        policies: PolicyBook | None = None,
        procedures: ProcedureSource | None = None,
        procedures_max_tokens: int,
    ) -> None:
        self._store = store
        # Approved procedures of the viewer's agent and groups: injected after the system prompt.
        self._procedures_max_tokens = procedures_max_tokens
        self._procedure_blocks = ProcedureBlocks()
        # Channel policies (recorded on each session at creation) choose strategy and window per channel.
        self._policies = policies or PolicyBook(ChannelPolicy())
        self._traces = TurnTraces(traces, store)
        self._counter = counter
        self._memory: MemorySource = memory or NoMemory()
        self._scheduler = scheduler
        self._policy = policy
        self._system_prompt = system_prompt
        self._default_model = default_model
        self._max_summary_tokens = max_summary_tokens
        self._executor = executor
        self._history = HistoryReader(store, counter, self._policy, executor)
        self._gather = Gatherer(
            store, self._memory, self._history, self._policy, resume, procedures=procedures or NoProcedures()
        )
        self._gap_summarizer = ExtractiveSummarizer(counter, executor=executor)
        # The wire form of conversation turns, filled by the API layer (see ``turn_memo``).
        self.turn_memo = TurnMemo()

    @property
    def policy(self) -> BudgetPolicy:
        return self._policy

    @property
    def traces(self) -> TraceStore:
        return self._traces.store

    def count_cache(self) -> tuple[int, int]:
        """(hits, misses) of turns' token counts: known without tokenizing vs tokenized now."""
        return self._history.count_hits, self._history.count_misses

    def forget(self, user_id: str, session_ids: set[str]) -> None:
        """Drops every cached copy of the user's data (erasure)."""
        self._history.forget(session_ids)
        self.turn_memo.forget(session_ids)
        self._memory.forget(user_id)
        # Built procedure blocks may quote the user (an example learned from their session): not keyed
        # by user, so all go; they are rebuilt on the next assembly.
        self._procedure_blocks.clear()

    # ------------------------------------------------------------------------------------- assembly

    async def assemble(self, req: AssembleRequest) -> AsyncIterator[Flush]:
        """Yields the system, profile, memory, summary and conversation blocks, in that order, batched
        into flushes: a flush goes out when the next section is not ready yet, so a slow section never
        holds back the ones before it, and sections that are ready together travel in one response
        (each response costs a round trip's worth of gRPC work). The last flush carries the stats."""
        started = time.perf_counter()
        created = now_ms()
        session = await spans.traced("memlane.assemble.session", self._gather.session(req))
        self.turn_memo.check(session)
        s = settle(
            req,
            session,
            policy=self._policy,
            channel=self._policies.for_session(session),
            counter=self._counter,
            default_model=self._default_model,
            trace_id=new_trace_id(created),
        )
        c = Composition(s, self._policy, self._max_summary_tokens)
        # Retrieval and the history read start now and overlap the blocks sent before them.
        reads = self._gather.start(s)
        try:
            ready = await self._system(c, await reads.procedures)
            # One turn of the loop lets retrieval that needs no I/O (a cached profile, no LTM) finish
            # and share the first response.
            await asyncio.sleep(0)
            for section, task in ((Section.PROFILE, reads.profile), (Section.MEMORY, reads.recall)):
                if not task.done():
                    yield Flush(ready)
                    ready = []
                ready.append(c.hits(section, await task))
            if not reads.history.done() and ready:
                yield Flush(ready)
                ready = []
            read = await reads.history
            history = await spans.traced("memlane.assemble.fold", self._history_blocks(c, read))
            stats = c.finish()
            stats.elapsed_us = int((time.perf_counter() - started) * 1e6)
            trace = TurnTrace(stats.trace_id, session.session_id, created, req, c.blocks, stats)
            stored = asyncio.ensure_future(self._traces.record(trace))
            try:
                yield Flush([*ready, *history], stats, stored)
            finally:
                # Not left running when the stream stops early; a failure reaches the caller through
                # whoever sends the stats (they await ``stored``), so it is not raised twice here.
                with contextlib.suppress(Exception):
                    await stored
        finally:
            await reads.cancel()

    async def _system(self, c: Composition, procedures: list[ProcedureText]) -> list[Block]:
        req = c.s.req
        system = req.system_prompt if req.system_prompt is not None else self._system_prompt
        limit = self._procedures_max_tokens
        if len(system) > INLINE_COUNT_CHARS:
            # Off the loop the block cache (not thread-safe) is bypassed: long prompts are rare.
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self._executor, c.system, system, procedures, limit, procedures_block
            )
        return c.system(system, procedures, limit, self._procedure_blocks.block)

    async def _history_blocks(self, c: Composition, read: GatheredHistory) -> tuple[Block, Block]:
        """The history step, with its gap folded (off the loop) and background summarization started."""
        s = c.s
        gap = c.history(read)
        folded, stored = (
            await fold_gap(self._gap_summarizer, self._store, s.session, s.req.viewer, gap)
            if gap is not None
            else (None, False)
        )
        blocks = c.history_blocks(folded, stored=stored)
        if c.summary_due is not None:
            if self._scheduler is None:
                s.stats.summary_request = c.summary_due
            else:
                s.stats.summarization_scheduled = self._scheduler.schedule(
                    s.session.session_id, c.summary_due
                )
        return blocks

    async def submit_summary(
        self, session_id: str, text: str, after_seq: int, through_seq: int, through_message_id: str
    ) -> Summary:
        return await submit_summary(
            self._store,
            self._history.count,
            self._gap_summarizer,
            self._max_summary_tokens,
            session_id=session_id,
            text=text,
            after_seq=after_seq,
            through_seq=through_seq,
            through_message_id=through_message_id,
        )

    # ---------------------------------------------------------------------------------------- traces

    async def get_trace(self, session_id: str, trace_id: str, viewer: Caller) -> TurnTrace:
        return await self._traces.get(session_id, trace_id, viewer)

    async def list_traces(
        self, viewer: Caller, session_id: str, page_size: int, page_token: str
    ) -> tuple[list[TurnTrace], str]:
        return await self._traces.list(viewer, session_id, page_size, page_token)

    async def aclose(self) -> None:
        if self._scheduler is not None:
            await self._scheduler.aclose()
