"""Learning during the session: an open session's turns become long-term memories while it goes on.

Without this, a fact stated in a long-running session reaches long-term memory only when the session
ends, so another session or agent of the same user cannot recall it meanwhile. Two halves, in two
processes:

- **the serving process notices** (``LearnScheduler``): an append only records, in memory, that the
  session has new turns (``notice``, no I/O). When a session is due (``every_turns`` new turns, or quiet
  for ``idle_s``), one learn job goes onto the background job stream (the session-end queue, so the same
  consumer groups, leases and hand-backs apply). No reading, extraction or embedding happens here.
- **a worker learns** (``Learner``, called by ``SessionEndWorker`` for learn jobs): it promotes the open
  session's turns not promoted yet, holding back the exchange still waiting for its answer unless the
  session went quiet. A channel policy may turn it off (``learn: false``, or ``promote: false``, which
  also stops promotion at session end).

**Facts at once** (``facts``): a fact or preference a user states must be searchable from their other
sessions and agents within seconds, not at the next threshold. An append with a new user turn marks its
session (in memory); the scheduler queues one facts job for it on the facts stream (a lane of its own, so
it never waits behind promotions), unless one is still waiting (``KeySpace.facts_marker``: however many
turns arrive meanwhile, one job reads them all). The worker clears the mark, reads the user turns after
``max(promoted_through, facts_through)`` and runs the extractor on them alone: no episodes (those keep
the thresholds), one ingest per audience, ids those of promotion (which later finds them stored and adds
nothing). Extraction runs only in the worker: a turn the extractor takes nothing from costs the serving
process one marker write and one stream entry, and the LTM nothing (no write, no version change, so no
reader catches up).

It runs the session-end pipeline's own promotion step (``SessionEndPipeline.promote_range``) under the
session's lease, so the same ``Promoter`` splits turns per audience (a private turn lands in its writer's
scope, a group turn in the group, a session-wide turn in the user's), ids are the same deterministic
ones, and progress is the pipeline's own ``promoted_through``: the session-end run starts after what was
learnt and adds nothing twice.

What is noticed lives in the serving process only: one that stops loses its notices, and the
session-end promotion then covers those turns as before. A learn job that finds the session held (its
end is running) is dropped for the same reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from ..errors import NotFound
from ..sessions.ending import (
    REASON_LEARN,
    REASON_LEARN_FACTS,
    REASON_LEARN_QUIET,
    EndState,
    SessionEndQueue,
)
from ..sessions.model import Message, PolicyBook, Role, SessionStatus
from ..sessions.store import SessionStore, now_ms
from .promote import Promoter
from .session_end import SessionEndPipeline

log = logging.getLogger("memlane.learn")

_ENDED = (SessionStatus.CLOSED, SessionStatus.EXPIRED)
_READ_BATCH = 200
# A facts job waits this long for the session's lease (a learn run lets go within a second or so).
_FACTS_LEASE_WAIT_S = 5.0


@dataclass(frozen=True, slots=True)
class LearnConfig:
    """Every field comes from a setting (no defaults here: the settings hold them; wiring/ builds this)."""

    every_turns: int  # 0: not by count
    idle_s: float  # 0: not on idle
    tick_s: float  # how often quiet sessions are looked for
    facts: bool  # a user turn's facts at once (while learning during the session is on)

    @property
    def enabled(self) -> bool:
        return self.every_turns > 0 or self.idle_s > 0

    @property
    def facts_at_once(self) -> bool:
        return self.facts and self.enabled


@dataclass(slots=True)
class _Pending:
    new_turns: int
    last_at: float  # monotonic time of the latest append


def held_back(messages: list[Message]) -> int:
    """How many trailing messages to keep for later: the last one when it is a user turn (its answer may
    still come, and promotion works on whole exchanges), else none."""
    return 1 if messages and messages[-1].role is Role.USER else 0


class LearnScheduler:
    """The serving process's half: notices appends in memory and queues a learn job when a session is
    due. Only Redis writes of one XADD per due session leave this process."""

    def __init__(
        self,
        queue: SessionEndQueue,
        config: LearnConfig,
        *,
        facts: SessionEndQueue | None = None,
        facts_wait_ms: int = 0,
    ) -> None:
        """``facts``: the facts jobs' stream (None: no facts at once); ``facts_wait_ms``: how long a facts
        job's mark keeps another from being queued (a job not taken by then is taken over anyway)."""
        self._queue = queue
        self._facts_queue = facts if config.facts_at_once else None
        self._facts_wait_ms = facts_wait_ms
        self.config = config
        self._pending: dict[str, _Pending] = {}
        self._facts: dict[str, None] = {}  # sessions with new user turns, in the order noticed
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def notice(self, session_id: str, new_turns: int, *, user_turns: int = 0) -> None:
        """Called after an append stored ``new_turns`` new messages, ``user_turns`` of them user turns
        (not transient); no I/O."""
        if new_turns <= 0 or not self.config.enabled:
            return
        if user_turns > 0 and self._facts_queue is not None:
            self._facts[session_id] = None
            self._wake.set()
        p = self._pending.get(session_id)
        if p is None:
            p = self._pending[session_id] = _Pending(0, 0.0)
        p.new_turns += new_turns
        p.last_at = time.monotonic()
        if self.config.every_turns and p.new_turns >= self.config.every_turns:
            self._wake.set()

    def start(self) -> None:
        if self.config.enabled and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="memlane-learn-scheduler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _due(self, now: float) -> list[tuple[str, bool]]:
        """(session, quiet) for every session to learn from now; ``quiet``: idle long enough to take the
        open exchange too."""
        out: list[tuple[str, bool]] = []
        for sid, p in self._pending.items():
            if self.config.idle_s and now - p.last_at >= self.config.idle_s:
                out.append((sid, True))
            elif self.config.every_turns and p.new_turns >= self.config.every_turns:
                out.append((sid, False))
        return out

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow stop()'s cancel
                async with asyncio.timeout(self.config.tick_s):
                    await self._wake.wait()
            self._wake.clear()
            await self._queue_facts()
            for sid, quiet in self._due(time.monotonic()):
                await self._queue_one(sid, quiet)

    async def _queue_facts(self) -> None:
        queue = self._facts_queue
        while queue is not None and self._facts:
            sid = next(iter(self._facts))
            del self._facts[sid]
            try:
                await queue.enqueue_once(sid, REASON_LEARN_FACTS, now_ms(), self._facts_wait_ms)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("could not queue a facts job; the next learn job takes the turn", exc_info=True)

    async def _queue_one(self, session_id: str, quiet: bool) -> None:
        p = self._pending[session_id]
        if quiet:
            del self._pending[session_id]
        else:
            # The count starts again at one: the run may hold the open exchange back (its answer has not
            # come), and that turn counts toward the next run, as it did when it was noticed. The quiet
            # timer keeps running, so a held-back turn is learnt once the session goes quiet anyway.
            p.new_turns = 1
        try:
            await self._queue.enqueue(session_id, REASON_LEARN_QUIET if quiet else REASON_LEARN, now_ms())
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("could not queue a learn job; session end still promotes its turns", exc_info=True)


class Learner:
    """A worker's half: runs one learn job."""

    def __init__(
        self,
        store: SessionStore,
        pipeline: SessionEndPipeline,
        *,
        policies: PolicyBook,
        state: EndState,
        promoter: Promoter | None = None,
        facts: Promoter | None = None,
        facts_queue: SessionEndQueue | None = None,
    ) -> None:
        """``promoter``: the session end's promotion, its writes marked as learning's (None: the
        pipeline's own); ``facts``: promotion of facts and preferences alone (no episodes), for facts
        jobs; ``facts_queue``: their stream (its marks are cleared here)."""
        self._promoter = promoter
        self._store = store
        self._pipeline = pipeline
        self._policies = policies
        self._state = state
        self._facts = facts
        self._facts_queue = facts_queue

    async def learn(self, session_id: str, *, whole: bool) -> int | None:
        """Promotes the open session's turns not promoted yet (without the open exchange unless
        ``whole``). Returns how many turns are left for later; None when another run holds the session."""
        return await self._pipeline.locked(
            session_id, lambda: self._learn(session_id, whole), None, wait_s=0.0
        )

    async def _learn(self, session_id: str, whole: bool) -> int:
        try:
            s = await self._store.get(session_id)
        except NotFound:
            return 0
        if s.status in _ENDED:
            return 0  # the session-end pipeline takes it from here
        policy = self._policies.for_session(s)
        if not (policy.promote and policy.learn):
            return 0
        through = await self._pipeline.promoted_through(session_id)
        if through >= s.last_seq:
            return 0
        tail = await self._tail(session_id, through, s.last_seq)
        keep = 0 if whole else held_back(tail)
        if keep >= len(tail):
            return keep
        await self._pipeline.promote_range(session_id, through, tail[-keep - 1].seq, promoter=self._promoter)
        return keep

    async def learn_facts(self, session_id: str) -> bool:
        """A facts job: the facts and preferences of the user turns not read yet. False when the session
        stayed held by another run (the caller queues the job again)."""
        if self._facts is None or self._facts_queue is None:
            return True
        queue = self._facts_queue
        # Cleared before the turns are read: a turn appended from now on queues another job.
        await queue.clear_marker(session_id)
        done = await self._pipeline.locked(
            session_id, lambda: self._learn_facts(session_id), None, wait_s=_FACTS_LEASE_WAIT_S
        )
        return done is not None

    async def _learn_facts(self, session_id: str) -> bool:
        assert self._facts is not None
        try:
            s = await self._store.get(session_id)
        except NotFound:
            return True
        policy = self._policies.for_session(s)
        if s.status in _ENDED or not (policy.promote and policy.learn):
            return True  # the session end takes it from here, or nothing is learnt while open
        progress = await self._state.progress(session_id)
        after = max(progress.promoted_through, progress.facts_through)
        if after >= s.last_seq:
            return True
        tail = await self._tail(session_id, after, s.last_seq)
        said = [m for m in tail if m.role is Role.USER and not m.transient]
        ids = await self._facts.promote(s, said) if said else []
        await self._state.record_facts(session_id, ids, tail[-1].seq if tail else s.last_seq)
        return True

    async def _tail(self, session_id: str, after: int, until: int) -> list[Message]:
        out: list[Message] = []
        while after < until:
            batch = await self._store.range_by_seq(session_id, after, until, _READ_BATCH)
            if not batch:
                break
            out += batch
            after = batch[-1].seq
        return out
