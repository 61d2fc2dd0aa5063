"""The background jobs of a worker (a worker process, or the serving process when ``worker_processes`` is
0), one registry started and stopped by its composition root:

- ``consume``: takes jobs from the shared queue (and a dead worker's stale ones), runs them with bounded
  concurrency, acknowledges them when done: session-end jobs through the pipeline, learn jobs (and, on
  a lane of their own, facts jobs) through the ``Learner``; a session-end job that fails
  ``max_failures`` times is parked (dead-lettered) with a PARKED event and a metric, for an operator to
  inspect and retry;
- ``retire``: retires archived sessions whose hot retention ran out;
- ``retention``: deletes archive parts older than their channel's archive retention (one sidecar per
  interval, under a lock).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter

from ..errors import Conflict, DataLoss, MemlaneError, NotFound, ResourceExhausted, Unavailable
from ..observability import spans
from ..sessions.ending import (
    LEARN_REASONS,
    REASON_LEARN_FACTS,
    REASON_LEARN_QUIET,
    REASON_SUMMARIZE,
    EndJob,
    EndState,
    SessionEndQueue,
)
from ..sessions.events import EventLog, EventType, SessionEvent
from ..sessions.model import PolicyBook
from ..sessions.store import SessionStore, now_ms
from .incremental import Learner
from .session_end import LeaseLost, SessionEndPipeline

log = logging.getLogger("memlane.pipeline")


def consumer_name() -> str:
    """Unique per process: a restarted sidecar must not inherit (and so never time out) its old jobs."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


# A summarize job: (session, through seq, budget in tokens) -> the summary stored (context/summaries.py).
Summarize = Callable[[str, int, int], Awaitable[object]]
# Domain errors that say "not now" rather than "never": such a job is retried, not dropped (and parked for
# an operator if it keeps failing: a damaged table needs one).
_RETRIED = (Conflict, ResourceExhausted, DataLoss)
_SUMMARY_CONCURRENCY = 2  # summaries run at once in a worker, beside its session-end and learn jobs
_FACTS_CONCURRENCY = 2  # facts jobs likewise: a few ms of extraction each, wanted within seconds


@dataclass(slots=True)
class _Lane:
    """One stream this worker consumes, with its own bound on jobs in flight."""

    queue: SessionEndQueue
    concurrency: int
    inflight: set[asyncio.Task[None]] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Every field comes from a setting (no defaults here: the settings hold them; wiring/ builds this)."""

    concurrency: int
    claim_timeout_ms: int  # a job idle this long (its sidecar stopped refreshing it) is taken over
    retire_interval_s: float
    retention_interval_s: float
    max_failures: int  # failed runs before a job is parked; 0: retry forever


class QueueMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.failures = Counter(
            "memlane_session_end_job_failures_total",
            "Session-end pipeline runs that failed (the job is retried after the claim timeout).",
            registry=registry,
        )
        self.parked = Counter(
            "memlane_session_end_jobs_parked_total",
            "Session-end jobs parked after too many failures (list and retry: `memlane jobs`).",
            registry=registry,
        )


class SessionEndWorker:
    def __init__(
        self,
        state: EndState,
        queue: SessionEndQueue,
        pipeline: SessionEndPipeline,
        *,
        policies: PolicyBook,
        config: WorkerConfig,
        sessions: SessionStore,
        events: EventLog,
        metrics: QueueMetrics,
        learner: Learner | None = None,
        summarize: Summarize | None = None,
        summaries: SessionEndQueue | None = None,
        facts: SessionEndQueue | None = None,
    ) -> None:
        """``summaries``: the summarize jobs' stream, read by a lane of its own (``summarize`` runs them);
        ``facts``: the facts jobs' stream, likewise (the ``learner`` runs them)."""
        self._learner = learner
        self._summarize = summarize
        self._end = state
        self._sessions = sessions
        self._events = events
        self._metrics = metrics
        self._queue = queue
        self._pipeline = pipeline
        self._policies = policies
        self._config = config
        self.consumer = consumer_name()
        self._tasks: list[asyncio.Task[None]] = []
        self._lanes = [_Lane(queue, config.concurrency)]
        if summaries is not None and summarize is not None:
            self._lanes.append(_Lane(summaries, _SUMMARY_CONCURRENCY))
        if facts is not None and learner is not None:
            self._lanes.append(_Lane(facts, _FACTS_CONCURRENCY))
        # The job each in-flight task runs, and its lane's queue (where it is acknowledged or handed back).
        self._jobs: dict[asyncio.Task[None], tuple[SessionEndQueue, EndJob]] = {}
        self.completed = 0

    async def start(self) -> None:
        for lane in self._lanes:
            await lane.queue.ensure_group()
        self._tasks = [
            *(
                asyncio.create_task(self._consume(lane), name=f"memlane-jobs:{lane.queue.key}")
                for lane in self._lanes
            ),
            asyncio.create_task(
                self._periodic(self._retire_once, self._config.retire_interval_s), name="memlane-retire"
            ),
            asyncio.create_task(
                self._periodic(self._retention_once, self._config.retention_interval_s),
                name="memlane-retention",
            ),
        ]

    async def stop(self) -> None:
        """Cancels in-flight runs too (each releases its session lease as it unwinds) and hands their
        jobs back to the queue, so another sidecar takes them at once rather than after the claim
        timeout; every step is safe to repeat."""
        running = dict(self._jobs)
        inflight = [t for lane in self._lanes for t in lane.inflight]
        for t in [*self._tasks, *inflight]:
            t.cancel()
        for t in [*self._tasks, *inflight]:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        for task, (queue, job) in running.items():
            if task.cancelled() and job.session_id:
                try:
                    await queue.hand_back(job)
                    log.info("handed a session-end job back", extra={"session_id": job.session_id})
                except Exception:  # Redis gone: the claim timeout still hands it over
                    log.warning("could not hand a job back", extra={"session_id": job.session_id})

    def _done(self, task: asyncio.Task[None]) -> None:
        for lane in self._lanes:
            lane.inflight.discard(task)
        self._jobs.pop(task, None)

    async def _consume(self, lane: _Lane) -> None:
        last_claim = 0.0
        queue = lane.queue
        while True:
            try:
                free = lane.concurrency - len(lane.inflight)
                if free <= 0:
                    await asyncio.wait(lane.inflight, return_when=asyncio.FIRST_COMPLETED)
                    continue
                jobs: list[EndJob] = []
                if time.monotonic() - last_claim > self._config.claim_timeout_ms / 2000:
                    last_claim = time.monotonic()
                    jobs = await queue.claim_stale(self.consumer, self._config.claim_timeout_ms, free)
                if not jobs:
                    jobs = await queue.read(self.consumer, free, block_ms=1000)
                for job in jobs:
                    # A trace of its own, linked to the request that queued the job.
                    traced = spans.job(
                        f"memlane.job {job.reason}", job.traceparent, self._process(queue, job)
                    )
                    task = asyncio.create_task(traced)
                    lane.inflight.add(task)
                    self._jobs[task] = (queue, job)
                    task.add_done_callback(self._done)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("session-end queue read failed; retrying")
                await asyncio.sleep(1.0)

    async def _process(self, queue: SessionEndQueue, job: EndJob) -> None:
        if not job.session_id:
            await queue.ack([job.job_id])
            return
        if job.reason in LEARN_REASONS:
            await self._learn(job)
            await queue.ack([job.job_id])
            return
        if job.reason == REASON_LEARN_FACTS:
            await self._facts(queue, job)
            await queue.ack([job.job_id])
            return
        if job.reason == REASON_SUMMARIZE:
            await self._summary(job)
            await queue.ack([job.job_id])
            return

        async def keep_job() -> None:
            await self._queue.keep_alive(self.consumer, [job.job_id])

        try:
            report = await self._pipeline.handle_job(job.session_id, job.reason, keep_job)
        except asyncio.CancelledError:
            raise
        except LeaseLost:
            log.warning(
                "lost the session lease mid-run; the job will be retried",
                extra={"session_id": job.session_id},
            )
            return
        except Unavailable as exc:
            # A store that did not answer (an object store paused, a full disk): the job stays pending and
            # is taken again after the claim timeout, without counting toward parking (an outage of a few
            # minutes must not need an operator). Dropping it left the session ended but never archived.
            log.warning(
                "session-end job met an unavailable store; it will be retried",
                extra={"session_id": job.session_id, "error": str(exc)},
            )
            return
        except _RETRIED as exc:  # a concurrent change won, or the store shed load: a failure, retried
            await self._failed(job, exc)
            return
        except MemlaneError as exc:
            # A domain refusal will not change on retry (e.g. the session was deleted): drop the job.
            log.warning("session-end job dropped", extra={"session_id": job.session_id, "error": str(exc)})
            await self._queue.ack([job.job_id])
            return
        except Exception as exc:
            await self._failed(job, exc)
            return
        if report is None and await self._still_to_end(job.session_id):
            return  # someone else held the session: leave the job for the claim timeout
        await self._queue.ack([job.job_id])
        await self._queue.clear_marker(job.session_id)
        self.completed += 1

    async def _learn(self, job: EndJob) -> None:
        """A learn job is acknowledged whatever happens: a run that fails or finds the session held (its
        end is running) leaves the turns to the next learn job or to the session end, which promotes
        everything not promoted yet."""
        try:
            if self._learner is not None:
                await self._learner.learn(job.session_id, whole=job.reason == REASON_LEARN_QUIET)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "learning from an open session failed; session end still promotes its turns",
                extra={"session_id": job.session_id},
            )

    async def _facts(self, queue: SessionEndQueue, job: EndJob) -> None:
        """Acknowledged whatever happens, like a learn job; one that found the session held by another
        run past its wait is queued again (the run holding it may leave the open turn for later)."""
        try:
            if self._learner is not None and not await self._learner.learn_facts(job.session_id):
                await queue.enqueue_once(job.session_id, job.reason, now_ms(), self._config.claim_timeout_ms)
        except asyncio.CancelledError:
            raise
        except Unavailable as exc:  # a store or the model process away for a moment: expected, no trace
            log.warning(
                "learning a turn's facts met an unavailable store; the next learn job or the session end"
                " takes them",
                extra={"session_id": job.session_id, "error": str(exc)},
            )
        except Exception:
            log.exception(
                "learning a turn's facts failed; the next learn job or the session end takes them",
                extra={"session_id": job.session_id},
            )

    async def _summary(self, job: EndJob) -> None:
        """A summarize job is acknowledged whatever happens: the next assembly over the threshold asks
        again, and a summary another writer moved meanwhile wins (compare-and-set)."""
        try:
            if self._summarize is not None:
                await self._summarize(job.session_id, job.through_seq, job.budget)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("a background summary failed", extra={"session_id": job.session_id})

    async def _still_to_end(self, session_id: str) -> bool:
        """After a run that did not happen (``handle_job`` gave None): whether the job must stay queued.
        The lease being gone a moment later proves nothing: an open-session learner, a resumption or a
        run whose lease lapsed lets go just as fast, and none of them finished this job (likely how the
        chaos campaign lost a closed session's only job, leaving it PROMOTING with nothing queued).
        Only a session that no longer exists has nothing left to end; a spare run of an archived one is
        a no-op."""
        try:
            await self._sessions.get(session_id)
        except NotFound:
            return False
        return True

    async def _failed(self, job: EndJob, exc: Exception) -> None:
        """Counts the failure; the job stays pending (retried after the claim timeout) until it has
        failed ``max_failures`` times, then it is parked so it stops costing a run every interval."""
        self._metrics.failures.inc()
        failures = await self._queue.record_failure(job.job_id)
        limit = self._config.max_failures
        if not limit or failures < limit:
            log.exception(
                "session-end job failed; it will be retried",
                extra={"session_id": job.session_id, "failures": failures},
            )
            return
        error = f"{type(exc).__name__}: {exc}"
        detail = {"failures": str(failures), "error": error[:200]}
        try:
            session = await self._sessions.get(job.session_id)
            event = SessionEvent.of(EventType.PARKED, session, now_ms(), **detail)
        except NotFound:
            event = SessionEvent(EventType.PARKED, job.session_id, at_ms=now_ms(), detail=detail)
        # Written by the park script itself (which adds the parked id), so a crash cannot separate them.
        parked_id = await self._queue.park(job, failures, error, now_ms(), self._events.queue_entry(event))
        await self._queue.clear_marker(job.session_id)
        self._metrics.parked.inc()
        log.error(
            "session-end job parked after repeated failures",
            exc_info=exc,
            extra={"session_id": job.session_id, "failures": failures, "parked_id": parked_id},
        )
        await self._events.relay_queue()

    @staticmethod
    async def _periodic(fn: Callable[[], Awaitable[None]], interval_s: float) -> None:
        while True:
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("periodic pipeline job failed", extra={"job": getattr(fn, "__name__", "?")})
            await asyncio.sleep(interval_s)

    async def _retire_once(self) -> None:
        while await self._pipeline.retire_due() >= 100:
            pass

    async def _retention_once(self) -> None:
        ttl_ms = max(1000, int(self._config.retention_interval_s * 1000 * 0.9))
        if not await self._end.take_job_lock("archive-retention", self.consumer, ttl_ms):
            return  # another sidecar ran it this interval
        deleted = await self.run_retention()
        if deleted:
            log.info("archive retention", extra={"deleted_files": deleted})

    async def run_retention(self) -> int:
        return await self._pipeline.archive.delete_expired(
            lambda channel: self._policies.for_channel(channel).archive_retention, now_ms()
        )
