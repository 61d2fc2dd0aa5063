"""Background summarization: off the request path and out of the serving process, persisted by
compare-and-set.

Assembly decides *what* should leave the window (a ``SummaryRange``); ``SummaryScheduler`` (serving)
queues one summarize job for it on the background job stream, and a worker's ``SummaryWriter`` runs the
summarizer on just those turns and the previous summary, then stores the result with
``set_summary(expected_through_seq=previous)``. If another writer (a client ``SubmitSummary``, a
resumption) moved the summary meanwhile, the store raises ``Conflict`` and this result is dropped: the
next assembly plans again. The summarizer is CPU work in Python (the extractive one holds the interpreter
lock while it scores sentences), which is why it never runs where requests are served.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from dataclasses import replace

from ..errors import Conflict, MemlaneError
from ..sessions.ending import REASON_SUMMARIZE, SessionEndQueue
from ..sessions.model import Summary
from ..sessions.store import SessionStore
from ..summarizers import Summarizer
from ..summarizers.scoped import fold_scoped
from ..tokens import TokenCounter
from .model import SummaryRange
from .traces import now_ms

log = logging.getLogger("memlane.context")


# One job per session and range: assemblies meanwhile (the summary lands a moment later) queue no more,
# unless the last one is this old (lost with a worker that died before taking it, say).
_REQUEUE_AFTER_S = 30.0


class SummaryScheduler:
    """The serving half: queues a summarize job when assembly asks for one (no I/O on the request path:
    the XADD runs in a task)."""

    def __init__(self, queue: SessionEndQueue) -> None:
        self._queue = queue
        self._queued: dict[str, tuple[int, float]] = {}  # session -> (through_seq, monotonic time)
        self._tasks: set[asyncio.Task[None]] = set()

    def schedule(self, session_id: str, rng: SummaryRange) -> bool:
        """Queues summarizing ``rng`` unless a job for this range (or a later one) was queued lately."""
        now = time.monotonic()
        last = self._queued.get(session_id)
        if last is not None and last[0] >= rng.through_seq and now - last[1] < _REQUEUE_AFTER_S:
            return False
        self._queued[session_id] = (rng.through_seq, now)
        if len(self._queued) > _MAX_REMEMBERED:
            self._queued = {k: v for k, v in self._queued.items() if now - v[1] < _REQUEUE_AFTER_S}
        task = asyncio.create_task(self._enqueue(session_id, rng), name=f"summarize:{session_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _enqueue(self, session_id: str, rng: SummaryRange) -> None:
        try:
            await self._queue.enqueue(
                session_id, REASON_SUMMARIZE, now_ms(), through_seq=rng.through_seq, budget=rng.budget_tokens
            )
        except Exception:  # the next assembly over the threshold asks again
            self._queued.pop(session_id, None)
            log.warning("could not queue a summary", extra={"session_id": session_id}, exc_info=True)

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


_MAX_REMEMBERED = 10_000


class SummaryWriter:
    """A worker's half: runs one summarize job."""

    def __init__(
        self,
        store: SessionStore,
        summarizer: Summarizer,
        counter: TokenCounter,
        executor: Executor | None = None,
    ) -> None:
        self._store = store
        self._summarizer = summarizer
        self._counter = counter
        self._executor = executor

    async def run(self, session_id: str, through_seq: int, budget_tokens: int) -> Summary | None:
        """A queued job: the summary stored, or None when it was superseded or failed (logged)."""
        try:
            return await self.summarize(session_id, through_seq, budget_tokens)
        except Conflict as exc:
            log.info("summary superseded", extra={"session_id": session_id, "detail": str(exc)})
        except MemlaneError as exc:
            log.warning("summarization failed", extra={"session_id": session_id, "detail": str(exc)})
        return None

    async def summarize(self, session_id: str, through_seq: int, budget_tokens: int) -> Summary:
        """Folds the turns up to ``through_seq`` that the stored summary lacks into it, and stores it."""
        session = await self._store.get(session_id)
        prev = session.summary
        if prev.through_seq >= through_seq:
            return prev
        # Read only the leaving turns: the previous summary stands for everything before them.
        leaving = await self._store.range_by_seq(
            session_id, prev.through_seq, through_seq, limit=through_seq - prev.through_seq
        )
        if not leaving:
            return prev
        # Every scope's turns are folded into that scope's part (see summarizers.scoped), so no turn
        # leaves the window without landing in the summary of everyone who may read it.
        folded = await fold_scoped(self._summarizer, prev, leaving, budget_tokens)
        loop = asyncio.get_running_loop()
        tokens = await loop.run_in_executor(self._executor, self._counter.count, folded.text, session.model)
        new = replace(folded, token_count=tokens, updated_at_ms=now_ms())
        await self._store.set_summary(session_id, new, expected_through_seq=prev.through_seq, read=session)
        return new
