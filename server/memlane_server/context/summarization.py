"""Background summarization: off the request path, one task per session, persisted by compare-and-set.

Assembly decides *what* should leave the window (a ``SummaryRange``); this runs the summarizer on just
those turns and the previous summary, then stores the result with ``set_summary(expected_through_seq=
previous)``. If another writer (a client ``SubmitSummary``, a resumption) moved the summary meanwhile,
the store raises ``Conflict`` and this result is dropped: the next assembly plans again.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from dataclasses import replace

from ..errors import Conflict, MemlaneError
from ..sessions.model import Summary
from ..sessions.store import SessionStore
from ..summarizers import Summarizer
from ..summarizers.scoped import fold_scoped
from ..tokens import TokenCounter
from .model import SummaryRange
from .traces import now_ms

log = logging.getLogger("memlane.context")


class SummaryScheduler:
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
        self._tasks: dict[str, asyncio.Task[Summary | None]] = {}

    @property
    def provider(self) -> str:
        return self._summarizer.provider

    def running(self, session_id: str) -> bool:
        return session_id in self._tasks

    def schedule(self, session_id: str, rng: SummaryRange) -> bool:
        """Starts summarizing ``rng`` unless this session already has a run in flight."""
        if session_id in self._tasks:
            return False
        task = asyncio.create_task(self._guarded(session_id, rng), name=f"summarize:{session_id}")
        self._tasks[session_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(session_id, None))
        return True

    async def wait(self, session_id: str) -> Summary | None:
        """The result of the session's run in flight (None if there is none or it failed)."""
        task = self._tasks.get(session_id)
        return await asyncio.shield(task) if task else None

    async def _guarded(self, session_id: str, rng: SummaryRange) -> Summary | None:
        try:
            return await self.summarize(session_id, rng)
        except Conflict as exc:
            log.info("summary superseded", extra={"session_id": session_id, "detail": str(exc)})
        except MemlaneError as exc:
            log.warning("summarization failed", extra={"session_id": session_id, "detail": str(exc)})
        except Exception:
            log.exception("summarization crashed", extra={"session_id": session_id})
        return None

    async def summarize(self, session_id: str, rng: SummaryRange) -> Summary:
        """Folds the turns up to ``rng.through_seq`` that the stored summary lacks into it, and stores it."""
        session = await self._store.get(session_id)
        prev = session.summary
        if prev.through_seq >= rng.through_seq:
            return prev
        # Read only the leaving turns: the previous summary stands for everything before them.
        leaving = await self._store.range_by_seq(
            session_id, prev.through_seq, rng.through_seq, limit=rng.through_seq - prev.through_seq
        )
        if not leaving:
            return prev
        # Every scope's turns are folded into that scope's part (see summarizers.scoped), so no turn
        # leaves the window without landing in the summary of everyone who may read it.
        folded = await fold_scoped(self._summarizer, prev, leaving, rng.budget_tokens)
        loop = asyncio.get_running_loop()
        tokens = await loop.run_in_executor(self._executor, self._counter.count, folded.text, session.model)
        new = replace(folded, token_count=tokens, updated_at_ms=now_ms())
        await self._store.set_summary(session_id, new, expected_through_seq=prev.through_seq, read=session)
        return new

    async def aclose(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
