"""The session-end pipeline: discard, summarize, promote, archive, then (later) retire the hot data.

Progress lives in Redis next to the session (``KeySpace.pipeline``: a HASH of through-seqs and archive
pointers; ``KeySpace.promoted``: the SET of promoted memory ids), written after each step or chunk, so
a run that dies anywhere resumes where the last one stopped and every step is safe to repeat:

1. **discard**: transient messages leave Redis (``discarded_through``).
2. **summarize**: the session-wide turns after the stored summary are folded into it (compare-and-set on
   through_seq); private and group turns stay out of this document every reader gets.
3. **promote**: whole exchanges, a chunk at a time, through the ``Promoter`` (``promoted_through`` + the
   ids). Skipped, but recorded, when the channel's policy says not to promote.
4. **archive**: only once promotion finished; one Parquet part per end (``archived_through``).
5. **retire**: after the channel's hot retention, an atomic script drops messages and traces and keeps a
   stub (status, summary, archive pointers). It refuses if anything was written since the archive.

``promotion_state`` on the session document follows along: PENDING/NONE -> PROMOTING -> PROMOTED ->
ARCHIVED. A per-session lease keeps two sidecars off one session; the queue brings a dead sidecar's job
back to someone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from ..checkpoints.store import CheckpointArchiver, CheckpointStore
from ..errors import Conflict, NotFound
from ..sessions.ending import REASON_EXPIRED, REASON_FORCED, EndProgress, EndState
from ..sessions.events import EventType, pending
from ..sessions.lifecycle import Lifecycle
from ..sessions.model import ArchivePointer, Message, PromotionState, Retirement, Role, Session, SessionStatus
from ..sessions.store import SessionStore, now_ms
from ..sessions.traces import TraceRecords
from ..summarizers import Summarizer
from ..summarizers.summarizer import fold_scoped
from .archive import ArchiveStore
from .archive_tables import ArchivePart
from .promote import Promoter

log = logging.getLogger("memlane.pipeline")

T = TypeVar("T")
_ENDED = (SessionStatus.CLOSED, SessionStatus.EXPIRED)
_FORCED_LEASE_WAIT_S = 10.0


class LeaseLost(Exception):
    """The per-session lease ran out under us (a long stall); another sidecar may now own the session."""


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """Every field comes from a setting (no defaults here: the settings hold them; wiring/ builds this)."""

    chunk_messages: int  # messages per promotion chunk / read batch; progress is saved per chunk
    summary_tokens: int  # budget of the final summary
    lease_ms: int  # per-session lease; also how long a dead sidecar's session stays blocked


@dataclass(slots=True)
class EndReport:
    session: Session
    promoted_ids: list[str] = field(default_factory=list)
    archives: list[ArchivePointer] = field(default_factory=list)
    ran: bool = False  # False: nothing was left to do (or the session is not ended)


class SessionEndPipeline:
    def __init__(
        self,
        store: SessionStore,
        lifecycle: Lifecycle,
        archive: ArchiveStore,
        *,
        state: EndState,
        traces: TraceRecords,
        checkpoints: CheckpointStore,
        summarizer: Summarizer | None,
        promoter: Promoter | None,
        config: PipelineConfig,
    ) -> None:
        self._store = store
        self._end = state
        self._traces_store = traces
        self._lifecycle = lifecycle
        self.archive = archive
        self._summarizer = summarizer
        self._promoter = promoter
        self.config = config
        self.checkpoints = CheckpointArchiver(checkpoints, archive)  # framework state retires too

    # ------------------------------------------------------------------ entry points

    async def handle_job(
        self, session_id: str, reason: str, keep_job: Callable[[], Awaitable[None]]
    ) -> EndReport | None:
        """A queued job. None when another run holds the session (the job stays queued). A forced job (a
        caller waits for it: PromoteSession) waits a while for the lease, as a learn run lets go soon."""
        wait_s = _FORCED_LEASE_WAIT_S if reason == REASON_FORCED else 0.0
        return await self.locked(session_id, lambda: self._run(session_id, reason), keep_job, wait_s=wait_s)

    async def locked(
        self,
        session_id: str,
        fn: Callable[[], Awaitable[T]],
        keep_job: Callable[[], Awaitable[None]] | None,
        *,
        wait_s: float,
    ) -> T | None:
        """Runs ``fn`` holding the session's lease, renewing it (and the queue job) as it goes; cancels
        ``fn`` and raises ``LeaseLost`` if a renewal finds the lease gone."""
        lease = self._end.lease(session_id, self.config.lease_ms)
        if not await lease.acquire(wait_s):
            return None
        work = asyncio.ensure_future(fn())
        lost = False

        async def keep() -> None:
            nonlocal lost
            while True:
                await asyncio.sleep(self.config.lease_ms / 3000)
                if not await lease.renew():
                    lost = True
                    work.cancel()
                    return
                if keep_job is not None:
                    await keep_job()

        keeper = asyncio.create_task(keep())
        try:
            return await work
        except asyncio.CancelledError:
            if lost:
                raise LeaseLost(f"lease on session {session_id!r} expired mid-run") from None
            work.cancel()
            raise
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
            if not lost:
                await lease.release()

    # ------------------------------------------------------------------ the run

    async def archives(self, session_id: str) -> list[ArchivePointer]:
        return [ArchivePointer.from_record(r) for r in await self._end.archive_records(session_id)]

    async def promoted_ids(self, session_id: str) -> list[str]:
        return await self._end.promoted_ids(session_id)

    async def report(self, session_id: str, ran: bool) -> EndReport:
        return EndReport(
            await self._store.get(session_id),
            await self.promoted_ids(session_id),
            await self.archives(session_id),
            ran,
        )

    async def _run(self, session_id: str, reason: str) -> EndReport | None:
        try:
            s = await self._store.get(session_id)
        except NotFound:
            return None
        if s.status not in _ENDED:
            if reason != REASON_EXPIRED:
                return EndReport(s)
            ended = await self._lifecycle.expire(session_id)
            if ended is None:
                return EndReport(s)  # revived before it could expire
            s = ended
        else:
            await self._lifecycle.untrack(session_id)  # a close's write-ahead deadline (Lifecycle.close)
        await self._lifecycle.events.relay(session_id)  # events a crashed run wrote but never relayed
        state = await self._end.progress(session_id)
        last = s.last_seq
        if s.promotion_state is PromotionState.ARCHIVED and state.archived_through >= last:
            return await self.report(session_id, ran=False)
        policy = self._lifecycle.policies.for_session(s)
        ended_at = (s.closed_at_ms if s.status is SessionStatus.CLOSED else s.expired_at_ms) or now_ms()
        promoted = (
            s.promotion_state is PromotionState.PROMOTED
            and min(state.discarded_through, state.promoted_through) >= last
        )
        if not promoted:  # a run that died after PROMOTED goes straight on to the archive
            await self._promote_phase(s, state, policy.promote)
        ids = await self.promoted_ids(session_id)

        archived_through = state.archived_through
        pointer: ArchivePointer | None = None
        if archived_through < last:
            s = await self._store.get(session_id)
            pointer = await self._archive(s, archived_through, last, ended_at, ids)
        detail = {"transcript": pointer.transcript} if pointer else {}
        await self._store.set_promotion_state(
            session_id, PromotionState.ARCHIVED, event=pending(EventType.ARCHIVED, now_ms(), **detail)
        )
        await self._lifecycle.events.relay(session_id)

        retire_at = max(ended_at + int(policy.hot_retention * 1000), now_ms())
        await self._end.schedule_retire(session_id, retire_at)
        if policy.hot_retention <= 0:
            await self._retire_locked(session_id)
        return await self.report(session_id, ran=True)

    async def _promote_phase(self, s: Session, state: EndProgress, promote: bool) -> None:
        """Discard, summarize and promote, then PROMOTED (its event written with the state)."""
        session_id, last = s.session_id, s.last_seq
        await self._store.set_promotion_state(session_id, PromotionState.PROMOTING)
        await self._discard(session_id, state.discarded_through, last)
        if self._summarizer is not None:
            await self._summarize(session_id, last)
        if state.promoted_through < last:
            if promote and self._promoter is not None:
                await self.promote_range(session_id, state.promoted_through, last)
            else:
                await self._end.record_promoted(session_id, (), last)
        ids = await self.promoted_ids(session_id)
        event = pending(EventType.PROMOTED, now_ms(), memories=str(len(ids)), promote=str(promote))
        await self._store.set_promotion_state(session_id, PromotionState.PROMOTED, event=event)
        await self._lifecycle.events.relay(session_id)

    async def _messages(self, session_id: str, after: int, until: int) -> list[Message]:
        """Every message with ``after < seq <= until``, read in bounded batches."""
        out: list[Message] = []
        cursor = after
        while cursor < until:
            batch = await self._store.range_by_seq(session_id, cursor, until, self.config.chunk_messages)
            if not batch:
                break
            out += batch
            cursor = batch[-1].seq
        return out

    async def _discard(self, session_id: str, after: int, last: int) -> None:
        if after >= last:
            return
        transient = [m.message_id for m in await self._messages(session_id, after, last) if m.transient]
        await self._end.discard(session_id, transient, last)

    async def _summarize(self, session_id: str, last: int) -> None:
        assert self._summarizer is not None
        for _ in range(3):  # a concurrent summary write (assembly) wins; fold again from its result
            s = await self._store.get(session_id)
            if s.summary.through_seq >= last:
                return
            summary = s.summary
            through = cursor = summary.through_seq
            while cursor < last:
                batch = await self._store.range_by_seq(session_id, cursor, last, self.config.chunk_messages)
                if not batch:
                    break
                # Per visibility scope: a private turn never enters the summary every agent reads.
                summary = await fold_scoped(self._summarizer, summary, batch, self.config.summary_tokens)
                cursor = batch[-1].seq
            if cursor == through:
                return
            try:
                await self._store.set_summary(
                    session_id, replace(summary, updated_at_ms=now_ms()), expected_through_seq=through
                )
                return
            except Conflict:
                continue

    def _exchange_chunks(self, msgs: list[Message]) -> list[list[Message]]:
        """Chunks of about ``chunk_messages`` that end just before a user turn, so no exchange (an episode)
        is split across two promotion calls."""
        chunks: list[list[Message]] = []
        current: list[Message] = []
        for m in msgs:
            if len(current) >= self.config.chunk_messages and m.role is Role.USER:
                chunks.append(current)
                current = []
            current.append(m)
        if current:
            chunks.append(current)
        return chunks

    async def promoted_through(self, session_id: str) -> int:
        """The last seq promoted to long-term memory (by session end, or by learning while open)."""
        return (await self._end.progress(session_id)).promoted_through

    async def promote_range(
        self, session_id: str, after: int, last: int, *, promoter: Promoter | None = None
    ) -> None:
        """Promotes the turns with ``after < seq <= last`` and records them as promoted; run under the
        session's lease (``locked``). Also the learner's step for open sessions (pipelines/incremental.py),
        with its own ``promoter`` (the same one, its writes marked as learning's)."""
        promoter = promoter or self._promoter
        assert promoter is not None
        s = await self._store.get(session_id)
        msgs = await self._messages(session_id, after, last)
        for chunk in self._exchange_chunks(msgs):
            ids = await promoter.promote(s, chunk)
            await self._end.record_promoted(session_id, ids, chunk[-1].seq)
        await self._end.record_promoted(session_id, (), last)

    async def _archive(
        self, s: Session, after: int, last: int, ended_at: int, promoted: list[str]
    ) -> ArchivePointer:
        msgs = await self._messages(s.session_id, after, last)
        traces = await self._traces_store.all(s.session_id)
        part = ArchivePart(s, msgs, traces, promoted, ended_at, after + 1, last)
        pointer = await self.archive.write(part)
        pointers = [p for p in await self.archives(s.session_id) if p.first_seq != pointer.first_seq]
        pointers.append(pointer)
        await self._end.record_archive(s.session_id, last, [p.to_record() for p in pointers])
        return pointer

    # ------------------------------------------------------------------ retirement

    async def retire(self, session_id: str) -> bool | None:
        """Retires one due session; None when another sidecar holds it (try again later)."""
        return await self.locked(session_id, lambda: self._retire_locked(session_id), None, wait_s=0.0)

    async def _retire_locked(self, session_id: str) -> bool:
        try:
            s = await self._store.get(session_id)
        except NotFound:
            await self._end.unschedule_retire(session_id)
            return False
        state = await self._end.progress(session_id)
        ck_generation, ck_uri = await self.checkpoints.before_retire(s)
        retirement = Retirement(
            now_ms(), [ArchivePointer.from_record(r) for r in state.archives], checkpoints_uri=ck_uri
        )
        done = await self._store.retire_hot(
            s, state.archived_through, retirement, pending(EventType.RETIRED, now_ms())
        )
        # Retired, or no longer retirable as archived (revived or re-ended: its next archive re-schedules).
        await self._end.unschedule_retire(session_id)
        if done:
            await self._lifecycle.events.relay(session_id)
            if ck_generation is not None:
                await self.checkpoints.after_retire(session_id, ck_generation)
        return done

    async def retire_due(self, limit: int = 100) -> int:
        n = 0
        for session_id in await self._end.due_retirements(now_ms(), limit):
            n += int(bool(await self.retire(session_id)))
        return n
