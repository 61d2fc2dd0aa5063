"""The gathering half of assembly: every read it needs, started together.

The session (resumed from the archive first when it was retired), then profile, recall and the history
read as concurrent tasks; the pure core (``core``) turns what they return into blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from ..errors import InvalidArgument
from ..observability import spans
from ..sessions.model import Session
from ..sessions.store import SessionStore
from .budget import BudgetPolicy
from .core import GatheredHistory, Settled
from .history import HistoryReader
from .model import AssembleRequest, Provenance, Section
from .sources import MemoryHit, MemorySource, NoMemory, ProcedureSource, ProcedureText


@dataclass(slots=True)
class Reads:
    profile: asyncio.Future[list[MemoryHit]]
    recall: asyncio.Future[list[MemoryHit]]
    history: asyncio.Future[GatheredHistory]
    procedures: asyncio.Future[list[ProcedureText]]

    async def cancel(self) -> None:
        """Stops whatever is still running (a client that went away, a failed step) and reaps it."""
        tasks = (self.profile, self.recall, self.history, self.procedures)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


class Gatherer:
    def __init__(
        self,
        store: SessionStore,
        memory: MemorySource,
        history: HistoryReader,
        policy: BudgetPolicy,
        resume: Callable[[Session], Awaitable[bool]] | None,
        *,
        procedures: ProcedureSource,
    ) -> None:
        self._procedures = procedures
        self._store = store
        self._memory = memory
        self._history = history
        self._policy = policy
        # Reloads a retired session's recent turns from the archive; True when it did (re-read then).
        self._resume = resume

    async def session(self, req: AssembleRequest) -> Session:
        if not req.session_id:
            raise InvalidArgument("session_id is required")
        if req.window_turns < 0 or req.memory_limit < 0:
            raise InvalidArgument("window_turns and memory_limit must not be negative")
        session = await self._store.get(req.session_id)
        if self._resume is not None and await self._resume(session):
            session = await self._store.get(req.session_id)
        return session

    def start(self, s: Settled) -> Reads:
        """Profile, recall, the history read and the viewer's approved procedures, as tasks."""
        session, req = s.session, s.req
        viewer = req.viewer
        # No caller identity (auth off, no agent header): the session's own agent is the viewer.
        agent = session.agent_id if viewer.unrestricted else viewer.agent_id
        if viewer.unrestricted and session.agent_id:
            viewer = replace(viewer, agent_id=session.agent_id)
        limit = req.memory_limit or self._policy.memory_limit
        # No long-term memory, or a section left out (an A/B baseline of what memory buys): nothing to
        # read, and no task to make for it (a task costs about as much as the rest of a cheap read).
        skip_ltm = isinstance(self._memory, NoMemory)
        return Reads(
            _empty()
            if skip_ltm or Provenance.PROFILE in req.omit
            else asyncio.create_task(
                spans.traced(
                    "memlane.assemble.profile",
                    self._memory.profile(session.user_id, viewer, s.plan.caps[Section.PROFILE]),
                )
            ),
            _empty()
            if skip_ltm or not req.user_input or Provenance.MEMORY in req.omit
            else asyncio.create_task(
                self._memory.recall(
                    session.user_id,
                    viewer,
                    req.user_input,
                    limit,
                    session.channel,
                    spares=limit,
                    session_id=session.session_id,
                )
            ),
            asyncio.create_task(
                spans.traced(
                    "memlane.assemble.history",
                    self._history.read(session, s.strategy, s.window_turns, req.viewer, s.model),
                )
            ),
            asyncio.create_task(
                spans.traced(
                    "memlane.assemble.procedures",
                    self._procedures.for_agent(agent, sorted(viewer.groups)),
                )
            ),
        )


def _empty() -> asyncio.Future[list[MemoryHit]]:
    done: asyncio.Future[list[MemoryHit]] = asyncio.get_running_loop().create_future()
    done.set_result([])
    return done
