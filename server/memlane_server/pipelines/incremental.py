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
from ..sessions.ending import REASON_LEARN, REASON_LEARN_QUIET, SessionEndQueue
from ..sessions.model import Message, PolicyBook, Role, SessionStatus
from ..sessions.store import SessionStore, now_ms
from .session_end import SessionEndPipeline

log = logging.getLogger("memlane.learn")

_ENDED = (SessionStatus.CLOSED, SessionStatus.EXPIRED)
_READ_BATCH = 200


@dataclass(frozen=True, slots=True)
class LearnConfig:
    """Every field comes from a setting (no defaults here: the settings hold them; wiring/ builds this)."""

    every_turns: int  # 0: not by count
    idle_s: float  # 0: not on idle
    tick_s: float  # how often quiet sessions are looked for

    @property
    def enabled(self) -> bool:
        return self.every_turns > 0 or self.idle_s > 0


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

    def __init__(self, queue: SessionEndQueue, config: LearnConfig) -> None:
        self._queue = queue
        self.config = config
        self._pending: dict[str, _Pending] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def notice(self, session_id: str, new_turns: int) -> None:
        """Called after an append stored ``new_turns`` new messages; no I/O."""
        if new_turns <= 0 or not self.config.enabled:
            return
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
            for sid, quiet in self._due(time.monotonic()):
                await self._queue_one(sid, quiet)

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

    def __init__(self, store: SessionStore, pipeline: SessionEndPipeline, *, policies: PolicyBook) -> None:
        self._store = store
        self._pipeline = pipeline
        self._policies = policies

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
        await self._pipeline.promote_range(session_id, through, tail[-keep - 1].seq)
        return keep

    async def _tail(self, session_id: str, after: int, until: int) -> list[Message]:
        out: list[Message] = []
        while after < until:
            batch = await self._store.range_by_seq(session_id, after, until, _READ_BATCH)
            if not batch:
                break
            out += batch
            after = batch[-1].seq
        return out
