"""Learning during the session: an open session's turns become long-term memories while it goes on.

Without this, a fact stated in a long-running session reaches long-term memory only when the session
ends, so another session or agent of the same user cannot recall it meanwhile. The learner promotes an
open session's new turns in the background:

- **when**: after ``every_turns`` new turns (the exchange still waiting for its answer is held back), or
  once the session has been quiet for ``idle_s`` (everything left). A channel policy may turn it off
  (``learn: false``, or ``promote: false``, which also stops promotion at session end).
- **off the request path**: an append only records, in memory, that the session has new turns
  (``notice``); a background task does the reading, extraction, embedding and writing.
- **the same rules and ids as session end**: it runs the session-end pipeline's own promotion step
  (``SessionEndPipeline.promote_range``) under the session's lease, so the same ``Promoter`` splits turns
  per audience (a private turn lands in its writer's scope, a group turn in the group, a session-wide
  turn in the user's), ids are the same deterministic ones, and progress is the pipeline's own
  ``promoted_through``: the session-end run starts after what was learnt and adds nothing twice.

What is noticed lives in this process only: a sidecar that stops loses its notices, and the session-end
promotion then covers those turns as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from ..errors import NotFound
from ..sessions.channel_policies import PolicyBook
from ..sessions.model import Message, Role, SessionStatus
from ..sessions.store import SessionStore
from .session_end import SessionEndPipeline

log = logging.getLogger("memlane.learn")

_ENDED = (SessionStatus.CLOSED, SessionStatus.EXPIRED)
_READ_BATCH = 200


@dataclass(frozen=True, slots=True)
class LearnConfig:
    every_turns: int = 8  # 0: not by count
    idle_s: float = 30.0  # 0: not on idle
    tick_s: float = 1.0  # how often quiet sessions are looked for

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


class IncrementalLearner:
    def __init__(
        self,
        store: SessionStore,
        pipeline: SessionEndPipeline,
        *,
        policies: PolicyBook,
        config: LearnConfig,
    ) -> None:
        self._store = store
        self._pipeline = pipeline
        self._policies = policies
        self.config = config
        self._pending: dict[str, _Pending] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ the append path: memory only

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

    # ------------------------------------------------------------------ running

    def start(self) -> None:
        if self.config.enabled and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="memlane-learner")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _due(self, now: float) -> list[tuple[str, bool]]:
        """(session, whole) for every session to learn from now; ``whole``: quiet long enough to take the
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
            for sid, whole in self._due(time.monotonic()):
                await self._learn_one(sid, whole)

    async def _learn_one(self, session_id: str, whole: bool) -> None:
        seen = self._pending.pop(session_id)
        try:
            left = await self.learn(session_id, whole=whole)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("learning from an open session failed; session end still promotes its turns")
            return
        if left is None:  # the session-end pipeline holds the session: look again next tick
            left = seen.new_turns
        if left:
            # Held back (an open exchange) or not run: keep it, merged with what arrived meanwhile.
            p = self._pending.setdefault(session_id, _Pending(0, seen.last_at))
            p.new_turns += left

    # ------------------------------------------------------------------ one session

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
