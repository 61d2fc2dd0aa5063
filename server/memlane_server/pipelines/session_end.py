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
from typing import Any, TypeVar

import orjson
import redis.asyncio as aioredis

from ..errors import Conflict, FailedPrecondition, NotFound
from ..sessions.end_queue import REASON_EXPIRED
from ..sessions.events import EventType, SessionEvent
from ..sessions.keys import KeySpace
from ..sessions.lifecycle import Lifecycle
from ..sessions.model import Message, PromotionState, Role, Session, SessionStatus
from ..sessions.store import SessionStore, now_ms
from ..summarizers import Summarizer
from ..summarizers.scoped import fold_scoped
from .archive import ArchivePart, ArchivePointer, ArchiveStore
from .checkpoint_archive import CheckpointArchiver
from .lease import Lease
from .promote import Promoter

log = logging.getLogger("memlane.pipeline")

T = TypeVar("T")
_ENDED = (SessionStatus.CLOSED, SessionStatus.EXPIRED)

# KEYS: doc, msgs, order, traces, tracedata.  ARGV: archived through-seq, the stub's new ``extra`` JSON.
# Drops the hot data only if the session is still ended, archived, and has nothing newer than the archive.
RETIRE = """
local st = redis.call('HMGET', KEYS[1], 'status', 'last_seq', 'promotion_state')
if not st[1] then return 0 end
if (st[1] ~= '3' and st[1] ~= '4') or st[3] ~= '5' then return 0 end
if tonumber(st[2]) ~= tonumber(ARGV[1]) then return 0 end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('HSET', KEYS[1], 'extra', ARGV[2])
return 1
"""

# Keys inside ``Session.extra`` on a retired stub.
RETIRED_FIELD = "retired_at_ms"
ARCHIVE_FIELD = "archive"


class LeaseLost(Exception):
    """The per-session lease ran out under us (a long stall); another sidecar may now own the session."""


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    chunk_messages: int = 200  # messages per promotion chunk / read batch; progress is saved per chunk
    summary_tokens: int = 1024  # budget of the final summary
    lease_ms: int = 30_000  # per-session lease; also how long a dead sidecar's session stays blocked


@dataclass(slots=True)
class EndReport:
    session: Session
    promoted_ids: list[str] = field(default_factory=list)
    archives: list[ArchivePointer] = field(default_factory=list)
    ran: bool = False  # False: nothing was left to do (or the session is not ended)


class SessionEndPipeline:
    def __init__(
        self,
        redis: aioredis.Redis,
        store: SessionStore,
        keys: KeySpace,
        lifecycle: Lifecycle,
        archive: ArchiveStore,
        *,
        summarizer: Summarizer | None,
        promoter: Promoter | None,
        config: PipelineConfig,
    ) -> None:
        self._redis = redis
        self._store = store
        self._keys = keys
        self._lifecycle = lifecycle
        self.archive = archive
        self._summarizer = summarizer
        self._promoter = promoter
        self.config = config
        self._retire = redis.register_script(RETIRE)
        self.checkpoints = CheckpointArchiver(redis, keys, archive)  # framework state retires too

    # ------------------------------------------------------------------ entry points

    async def handle_job(
        self, session_id: str, reason: str, keep_job: Callable[[], Awaitable[None]]
    ) -> EndReport | None:
        """A queued job. None when another sidecar holds the session (the job stays queued)."""
        return await self.locked(session_id, lambda: self._run(session_id, reason), keep_job, wait_s=0.0)

    async def force(self, session_id: str, *, close: bool, wait_s: float) -> EndReport:
        """PromoteSession: run now, here, waiting up to ``wait_s`` for another sidecar to let go."""
        s = await self._store.get(session_id)
        if s.status not in _ENDED:
            if not close:
                raise FailedPrecondition(
                    f"session {session_id!r} is {s.status.name.lower()}; close it first or set close"
                )
            await self._lifecycle.close(session_id)
        out = await self.locked(session_id, lambda: self._run(session_id, "forced"), None, wait_s=wait_s)
        if out is None:
            raise TimeoutError(f"another sidecar is still running the pipeline of session {session_id!r}")
        return out

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
        lease = Lease(self._redis, self._keys.lease(session_id), self.config.lease_ms)
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

    async def _state(self, session_id: str) -> dict[str, str]:
        raw: Any = await self._redis.hgetall(self._keys.pipeline(session_id))
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def archives(self, session_id: str) -> list[ArchivePointer]:
        raw: Any = await self._redis.hget(self._keys.pipeline(session_id), "archives")
        return [ArchivePointer.from_record(r) for r in orjson.loads(raw)] if raw else []

    async def promoted_ids(self, session_id: str) -> list[str]:
        members: Any = await self._redis.smembers(self._keys.promoted(session_id))
        return sorted(m.decode() for m in members)

    async def _report(self, session_id: str, ran: bool) -> EndReport:
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
        state = await self._state(session_id)
        last = s.last_seq
        if s.promotion_state is PromotionState.ARCHIVED and int(state.get("archived_through", 0)) >= last:
            return await self._report(session_id, ran=False)
        await self._store.set_promotion_state(session_id, PromotionState.PROMOTING)
        policy = self._lifecycle.policies.for_session(s)
        ended_at = (s.closed_at_ms if s.status is SessionStatus.CLOSED else s.expired_at_ms) or now_ms()

        await self._discard(session_id, int(state.get("discarded_through", 0)), last)
        if self._summarizer is not None:
            await self._summarize(session_id, last)
        promoted_through = int(state.get("promoted_through", 0))
        if promoted_through < last:
            if policy.promote and self._promoter is not None:
                await self.promote_range(session_id, promoted_through, last)
            else:
                await self._redis.hset(self._keys.pipeline(session_id), "promoted_through", last)
        await self._store.set_promotion_state(session_id, PromotionState.PROMOTED)
        s = await self._store.get(session_id)
        ids = await self.promoted_ids(session_id)
        await self._lifecycle.events.emit(
            SessionEvent.of(
                EventType.PROMOTED, s, now_ms(), memories=str(len(ids)), promote=str(policy.promote)
            )
        )

        archived_through = int(state.get("archived_through", 0))
        pointer: ArchivePointer | None = None
        if archived_through < last:
            pointer = await self._archive(s, archived_through, last, ended_at, ids)
        await self._store.set_promotion_state(session_id, PromotionState.ARCHIVED)
        s = await self._store.get(session_id)
        detail = {"transcript": pointer.transcript} if pointer else {}
        await self._lifecycle.events.emit(SessionEvent.of(EventType.ARCHIVED, s, now_ms(), **detail))

        retire_at = max(ended_at + int(policy.hot_retention * 1000), now_ms())
        await self._redis.zadd(self._keys.retire_due(), {session_id: retire_at})
        if policy.hot_retention <= 0:
            await self._retire_locked(session_id)
        return await self._report(session_id, ran=True)

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
        k = self._keys.session(session_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            if transient:
                pipe.hdel(k.messages, *transient)
                pipe.zrem(k.order, *transient)
            pipe.hset(self._keys.pipeline(session_id), "discarded_through", last)
            await pipe.execute()

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

    async def promote_range(self, session_id: str, after: int, last: int) -> None:
        """Promotes the turns with ``after < seq <= last`` and records them as promoted; run under the
        session's lease (``locked``). Also the learner's step for open sessions (pipelines/incremental.py)."""
        assert self._promoter is not None
        s = await self._store.get(session_id)
        msgs = await self._messages(session_id, after, last)
        for chunk in self._exchange_chunks(msgs):
            ids = await self._promoter.promote(s, chunk)
            async with self._redis.pipeline(transaction=True) as pipe:
                if ids:
                    pipe.sadd(self._keys.promoted(session_id), *ids)
                pipe.hset(self._keys.pipeline(session_id), "promoted_through", chunk[-1].seq)
                await pipe.execute()
        await self._redis.hset(self._keys.pipeline(session_id), "promoted_through", last)

    async def _traces(self, session_id: str) -> list[tuple[str, int, str]]:
        k = self._keys.session(session_id)
        rows: Any = await self._redis.zrange(k.traces, 0, -1, withscores=True)
        if not rows:
            return []
        ids = [r[0] for r in rows]
        payloads: Any = await self._redis.hmget(k.trace_data, ids)
        return [
            (tid.decode(), int(score), (p or b"").decode())
            for (tid, score), p in zip(rows, payloads, strict=True)
            if p is not None
        ]

    async def _archive(
        self, s: Session, after: int, last: int, ended_at: int, promoted: list[str]
    ) -> ArchivePointer:
        msgs = await self._messages(s.session_id, after, last)
        part = ArchivePart(s, msgs, await self._traces(s.session_id), promoted, ended_at, after + 1, last)
        pointer = await self.archive.write(part)
        pointers = [p for p in await self.archives(s.session_id) if p.first_seq != pointer.first_seq]
        pointers.append(pointer)
        await self._redis.hset(
            self._keys.pipeline(s.session_id),
            mapping={
                "archived_through": last,
                "archives": orjson.dumps([p.to_record() for p in pointers]).decode(),
            },
        )
        return pointer

    # ------------------------------------------------------------------ retirement

    async def retire(self, session_id: str) -> bool | None:
        """Retires one due session; None when another sidecar holds it (try again later)."""
        return await self.locked(session_id, lambda: self._retire_locked(session_id), None, wait_s=0.0)

    async def _retire_locked(self, session_id: str) -> bool:
        try:
            s = await self._store.get(session_id)
        except NotFound:
            await self._redis.zrem(self._keys.retire_due(), session_id)
            return False
        state = await self._state(session_id)
        archived_through = int(state.get("archived_through", 0))
        extra: dict[str, Any] = {
            **s.extra,
            RETIRED_FIELD: now_ms(),
            ARCHIVE_FIELD: orjson.loads(state.get("archives", "[]")),
        }
        ck_generation = await self.checkpoints.before_retire(s, extra)
        done = bool(
            await self._retire(
                keys=[
                    self._keys.session(session_id).doc,
                    self._keys.session(session_id).messages,
                    self._keys.session(session_id).order,
                    self._keys.session(session_id).traces,
                    self._keys.session(session_id).trace_data,
                ],
                args=[archived_through, orjson.dumps(extra).decode()],
            )
        )
        # Retired, or no longer retirable as archived (revived or re-ended: its next archive re-schedules).
        await self._redis.zrem(self._keys.retire_due(), session_id)
        if done:
            if ck_generation is not None:
                await self.checkpoints.after_retire(session_id, ck_generation)
            s = await self._store.get(session_id)
            await self._lifecycle.events.emit(SessionEvent.of(EventType.RETIRED, s, now_ms()))
        return done

    async def retire_due(self, limit: int = 100) -> int:
        due: Any = await self._redis.zrangebyscore(
            self._keys.retire_due(), "-inf", now_ms(), start=0, num=limit
        )
        n = 0
        for raw in due:
            n += int(bool(await self.retire(raw.decode())))
        return n
