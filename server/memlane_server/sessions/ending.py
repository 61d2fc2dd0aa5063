"""The background job queue: a Redis stream with one consumer group shared by every worker (the worker
processes of every sidecar, and ``memlane worker`` deployments).

A session-end job says "this session may have ended; finish it"; a learn job (``REASON_LEARN``) says
"this open session has new turns to learn from". Both are about one session and run under its lease.
Jobs are cheap to duplicate (every pipeline step is
idempotent and a per-session lease keeps two sidecars off one session), so producers never coordinate
beyond a short de-duplication marker. A job stays pending until acknowledged; if its sidecar dies, another
takes it over with XAUTOCLAIM once it has been idle for the claim timeout. The owner keeps a long job
fresh by re-claiming it to itself (which resets its idle time).

What the session-end pipeline keeps in Redis besides the session document (pipelines/session_end.py).

- ``KeySpace.pipeline``: a HASH of per-step through-seqs and the archive pointers (``EndProgress``);
- ``KeySpace.promoted``: the SET of long-term memory ids promoted from the session;
- ``KeySpace.retire_due``: when each archived session's hot data may leave Redis;
- the per-session lease and the named job locks that keep two sidecars off the same work.

Every write that must land with another (messages dropped and the step recorded, memories and the
through-seq) is one MULTI on the session's slot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from ..keyspace import KeySpace
from ..observability import spans
from . import scripts
from .leases import Lease

GROUP = "session-end"

REASON_EXPIRED = "expired"
REASON_CLOSED = "closed"
REASON_FORCED = "forced"
# Learning during the session (pipelines/incremental.py): after N new turns, holding back the open
# exchange; or once the session went quiet, everything.
REASON_LEARN = "learn"
REASON_LEARN_QUIET = "learn-quiet"
LEARN_REASONS = (REASON_LEARN, REASON_LEARN_QUIET)
# A user turn's facts and preferences, learnt at once (pipelines/incremental.py): queued on a stream of its
# own (``KeySpace.facts_queue``), at most one waiting per session (``KeySpace.facts_marker``).
REASON_LEARN_FACTS = "learn-facts"
# A background summary of an open session (context/summaries.py): the turns through ``through_seq``
# folded into its summary within ``budget`` tokens. Queued on a stream of its own
# (``KeySpace.summary_queue``): a summary is small and wanted soon, and must not wait behind promotions.
REASON_SUMMARIZE = "summarize"


@dataclass(frozen=True, slots=True)
class EndJob:
    job_id: str
    session_id: str
    reason: str
    enqueued_at_ms: int
    through_seq: int = 0  # a summarize job's range and budget (0 for other jobs)
    budget: int = 0
    # The span of the request that queued the job (W3C traceparent; "" untraced): the job's own trace
    # links to it (observability/spans.py).
    traceparent: str = ""

    def fields(self, at_ms: int) -> dict[str, str | int]:
        """The stream entry of this job, queued at ``at_ms``."""
        out: dict[str, str | int] = {"s": self.session_id, "r": self.reason, "at": at_ms}
        if self.through_seq:
            out.update(t=self.through_seq, b=self.budget)
        if self.traceparent:
            out["tp"] = self.traceparent
        return out


@dataclass(frozen=True, slots=True)
class ParkedJob:
    """A job that failed ``failures`` times, taken off the queue until an operator retries it."""

    parked_id: str  # its id in the parked stream
    session_id: str
    reason: str
    enqueued_at_ms: int
    failures: int
    error: str  # the last failure, shortened
    parked_at_ms: int


MAX_ERROR_CHARS = 500


class SessionEndQueue:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: KeySpace,
        *,
        key: str = "",
        marker: Callable[[str], str] | None = None,
    ) -> None:
        """``key``: another stream of the same kind (``KeySpace.summary_queue``); the default is the
        session-end queue. ``marker``: the key of a session's queued-job mark (``enqueue_once``); the
        default is the end's (``KeySpace.end_marker``)."""
        self._redis = redis
        self._keys = keys
        self.key = key or keys.session_end_queue()
        self._marker = marker or keys.end_marker
        self._park = redis.register_script(scripts.PARK)

    async def ensure_group(self) -> None:
        try:
            await self._redis.xgroup_create(self.key, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def enqueue(
        self, session_id: str, reason: str, now_ms: int, *, through_seq: int = 0, budget: int = 0
    ) -> str:
        job = EndJob("", session_id, reason, now_ms, through_seq, budget, spans.traceparent())
        out = await self._redis.xadd(self.key, job.fields(now_ms))  # type: ignore[arg-type]
        return out.decode() if isinstance(out, bytes) else str(out)

    async def enqueue_once(self, session_id: str, reason: str, now_ms: int, window_ms: int) -> bool:
        """Enqueues unless a job for this session was queued within ``window_ms`` (every sidecar hears
        the same expiry event; one job is enough). The worker clears the marker when it is done."""
        if not await self._redis.set(self._marker(session_id), reason, nx=True, px=window_ms):
            return False
        await self.enqueue(session_id, reason, now_ms)
        return True

    async def clear_marker(self, session_id: str) -> None:
        await self._redis.delete(self._marker(session_id))

    @staticmethod
    def _jobs(rows: list[tuple[bytes, dict[bytes, bytes]]] | None) -> list[EndJob]:
        out = []
        for job_id, f in rows or []:
            if not f:  # trimmed or deleted entry still listed in the pending list
                out.append(EndJob(job_id.decode(), "", "", 0))
                continue
            out.append(
                EndJob(
                    job_id.decode(),
                    f[b"s"].decode(),
                    f[b"r"].decode(),
                    int(f.get(b"at", b"0")),
                    int(f.get(b"t", b"0")),
                    int(f.get(b"b", b"0")),
                    f.get(b"tp", b"").decode(errors="replace"),
                )
            )
        return out

    async def read(self, consumer: str, count: int, block_ms: int) -> list[EndJob]:
        """New jobs for ``consumer`` (blocks up to ``block_ms``)."""
        rows: Any = await self._redis.xreadgroup(
            GROUP, consumer, {self.key: ">"}, count=count, block=block_ms
        )
        return self._jobs(rows[0][1] if rows else None)

    async def claim_stale(self, consumer: str, min_idle_ms: int, count: int) -> list[EndJob]:
        """Jobs another sidecar took and stopped refreshing (it died): now ``consumer``'s."""
        out: Any = await self._redis.xautoclaim(self.key, GROUP, consumer, min_idle_ms, "0-0", count=count)
        return self._jobs(out[1])

    async def keep_alive(self, consumer: str, job_ids: list[str]) -> None:
        """Resets the idle time of jobs this consumer is still working on."""
        if job_ids:
            await self._redis.xclaim(self.key, GROUP, consumer, 0, list[Any](job_ids), justid=True)

    async def ack(self, job_ids: list[str]) -> None:
        if job_ids:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xack(self.key, GROUP, *job_ids)
                pipe.xdel(self.key, *job_ids)
                pipe.hdel(self._keys.session_end_failures(), *job_ids)
                await pipe.execute()

    # ------------------------------------------------------------------ dead letters

    async def record_failure(self, job_id: str) -> int:
        """Counts one failed run of the job (shared by every sidecar); returns the count so far."""
        return int(await self._redis.hincrby(self._keys.session_end_failures(), job_id, 1))

    async def park(self, job: EndJob, failures: int, error: str, now_ms: int, event: bytes = b"") -> str:
        """Moves the job off the queue into the parked stream, atomically (it is never in both, never in
        neither), with ``event`` (an outbox entry, ``EventLog.queue_entry``) written in the same MULTI."""
        fields = {
            "s": job.session_id,
            "r": job.reason,
            "at": job.enqueued_at_ms,
            "n": failures,
            "e": error[:MAX_ERROR_CHARS],
            "pt": now_ms,
        }
        flat: list[Any] = []
        for name, value in fields.items():
            flat += [name, value]
        parked_id = await self._park(
            keys=[
                self._keys.session_end_parked(),
                self.key,
                self._keys.session_end_failures(),
                self._keys.session_end_outbox(),
            ],
            args=[job.job_id, GROUP, event, *flat],
        )
        return parked_id.decode() if isinstance(parked_id, bytes) else str(parked_id)

    async def parked(self, after_id: str, count: int) -> list[ParkedJob]:
        """Parked jobs oldest first, after ``after_id`` ("" for the first)."""
        start = f"({after_id}" if after_id else "-"
        rows: Any = await self._redis.xrange(self._keys.session_end_parked(), min=start, max="+", count=count)
        return [self._parked(i, f) for i, f in rows]

    async def parked_by_id(self, parked_ids: list[str]) -> dict[str, ParkedJob]:
        async with self._redis.pipeline(transaction=False) as pipe:
            for pid in parked_ids:
                pipe.xrange(self._keys.session_end_parked(), min=pid, max=pid, count=1)
            rows: Any = await pipe.execute()
        return {pid: self._parked(*r[0]) for pid, r in zip(parked_ids, rows, strict=True) if r}

    async def unpark(self, jobs: list[ParkedJob], now_ms: int) -> None:
        """Queues each job again (with a fresh failure count) and removes it from the parked stream."""
        for job in jobs:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.xadd(self.key, {"s": job.session_id, "r": job.reason, "at": now_ms})
                pipe.xdel(self._keys.session_end_parked(), job.parked_id)
                await pipe.execute()

    async def parked_count(self) -> int:
        return int(await self._redis.xlen(self._keys.session_end_parked()))

    @staticmethod
    def _parked(parked_id: bytes, f: dict[bytes, bytes]) -> ParkedJob:
        return ParkedJob(
            parked_id=parked_id.decode(),
            session_id=f[b"s"].decode(),
            reason=f[b"r"].decode(),
            enqueued_at_ms=int(f[b"at"]),
            failures=int(f[b"n"]),
            error=f[b"e"].decode(errors="replace"),
            parked_at_ms=int(f[b"pt"]),
        )

    async def hand_back(self, job: EndJob) -> None:
        """Gives a job this sidecar took but will not finish (it is shutting down) back to the group at
        once: the same job queued anew, the old entry acknowledged, atomically (one key, one slot), so
        another sidecar reads it now instead of claiming it after the claim timeout."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xadd(self.key, job.fields(job.enqueued_at_ms))  # type: ignore[arg-type]
            pipe.xack(self.key, GROUP, job.job_id)
            pipe.xdel(self.key, job.job_id)
            await pipe.execute()

    async def pending(self) -> int:
        info = await self._redis.xpending(self.key, GROUP)
        return int(info["pending"])

    async def pending_by_worker(self) -> dict[str, int]:
        """Jobs taken and not yet acknowledged, per worker (consumer) holding any."""
        info = await self._redis.xpending(self.key, GROUP)
        out: dict[str, int] = {}
        for c in info.get("consumers") or []:
            name = c["name"].decode() if isinstance(c["name"], bytes) else str(c["name"])
            out[name] = int(c["pending"])
        return out

    async def job_state(self, job_id: str) -> tuple[bool, int]:
        """(still queued, failed runs so far) of one job: an acknowledged job leaves the stream."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xrange(self.key, min=job_id, max=job_id, count=1)
            pipe.hget(self._keys.session_end_failures(), job_id)
            rows, failures = await pipe.execute()
        return bool(rows), int(failures or 0)

    async def oldest_age_ms(self, now_ms: int) -> int:
        """Age of the oldest unfinished job (0 when none): acknowledged jobs are deleted from the stream,
        so its first entry is the oldest, and a stream id starts with its creation time in ms."""
        first: Any = await self._redis.xrange(self.key, count=1)
        if not first:
            return 0
        job_id = first[0][0].decode() if isinstance(first[0][0], bytes) else str(first[0][0])
        return max(0, now_ms - int(job_id.split("-", 1)[0]))

    async def length(self) -> int:
        return int(await self._redis.xlen(self.key))


# ---------------------------------------- the end pipeline's progress (see the module docstring)


@dataclass(slots=True)
class EndProgress:
    """How far each step of the pipeline got (seqs, inclusive), and the archive parts written so far."""

    discarded_through: int = 0
    promoted_through: int = 0
    archived_through: int = 0
    facts_through: int = 0  # the turns facts jobs read, ahead of promoted_through (pipelines/incremental.py)
    archives: list[dict[str, Any]] = field(default_factory=list)  # ArchivePointer records

    @classmethod
    def decode(cls, raw: dict[bytes, bytes]) -> EndProgress:
        g = {k.decode(): v.decode() for k, v in raw.items()}
        records = orjson.loads(g["archives"]) if g.get("archives") else []
        return cls(
            discarded_through=int(g.get("discarded_through", 0)),
            promoted_through=int(g.get("promoted_through", 0)),
            archived_through=int(g.get("archived_through", 0)),
            facts_through=int(g.get("facts_through", 0)),
            archives=[r for r in records if isinstance(r, dict)],
        )


class EndState:
    def __init__(self, redis: aioredis.Redis, keys: KeySpace) -> None:
        self._redis = redis
        self._keys = keys

    async def progress(self, session_id: str) -> EndProgress:
        raw: Any = await self._redis.hgetall(self._keys.pipeline(session_id))
        return EndProgress.decode(raw)

    async def archive_records(self, session_id: str) -> list[dict[str, Any]]:
        raw: Any = await self._redis.hget(self._keys.pipeline(session_id), "archives")
        return [r for r in orjson.loads(raw) if isinstance(r, dict)] if raw else []

    async def promoted_ids(self, session_id: str) -> list[str]:
        members: Any = await self._redis.smembers(self._keys.promoted(session_id))
        return sorted(m.decode() for m in members)

    async def discard(self, session_id: str, message_ids: Sequence[str], through: int) -> None:
        """Drops transient messages from Redis and records the step, atomically."""
        k = self._keys.session(session_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            if message_ids:
                pipe.hdel(k.messages, *message_ids)
                pipe.zrem(k.order, *message_ids)
            pipe.hset(self._keys.pipeline(session_id), "discarded_through", through)
            await pipe.execute()

    async def record_promoted(self, session_id: str, memory_ids: Sequence[str], through: int) -> None:
        """Memories promoted from a chunk and the chunk's last seq, atomically."""
        async with self._redis.pipeline(transaction=True) as pipe:
            if memory_ids:
                pipe.sadd(self._keys.promoted(session_id), *memory_ids)
            pipe.hset(self._keys.pipeline(session_id), "promoted_through", through)
            await pipe.execute()

    async def record_facts(self, session_id: str, memory_ids: Sequence[str], through: int) -> None:
        """Memories a facts job learnt and the last seq it read, atomically; ``promoted_through`` stays
        (the turns' episodes are still to come)."""
        async with self._redis.pipeline(transaction=True) as pipe:
            if memory_ids:
                pipe.sadd(self._keys.promoted(session_id), *memory_ids)
            pipe.hset(self._keys.pipeline(session_id), "facts_through", through)
            await pipe.execute()

    async def record_archive(self, session_id: str, through: int, records: list[dict[str, Any]]) -> None:
        await self._redis.hset(
            self._keys.pipeline(session_id),
            mapping={"archived_through": through, "archives": orjson.dumps(records).decode()},
        )

    # ------------------------------------------------------------------ retirement schedule

    async def schedule_retire(self, session_id: str, at_ms: int) -> None:
        await self._redis.zadd(self._keys.retire_due(), {session_id: at_ms})

    async def unschedule_retire(self, session_id: str) -> None:
        await self._redis.zrem(self._keys.retire_due(), session_id)

    async def due_retirements(self, now_ms: int, limit: int) -> list[str]:
        due: Any = await self._redis.zrangebyscore(
            self._keys.retire_due(), "-inf", now_ms, start=0, num=limit
        )
        return [d.decode() for d in due]

    # ------------------------------------------------------------------ leases and locks

    def lease(self, session_id: str, ttl_ms: int) -> Lease:
        return Lease(self._redis, self._keys.lease(session_id), ttl_ms)

    async def leased(self, session_id: str) -> bool:
        """Whether some sidecar holds the session's lease right now."""
        return bool(await self._redis.exists(self._keys.lease(session_id)))

    async def take_job_lock(self, name: str, owner: str, ttl_ms: int) -> bool:
        """One sidecar per ``ttl_ms`` runs the named periodic job; True if this one may."""
        return bool(await self._redis.set(self._keys.job_lock(name), owner, nx=True, px=ttl_ms))
