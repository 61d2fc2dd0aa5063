"""Session lifecycle and the session-end pipeline: expiry and sweeps, the job queue and its worker, the
archive, resumption and learning during the session. The same parts are built in the serving process and
in a worker process; each starts its own half (``Lifecycle`` and ``LearnScheduler`` serve,
``SessionEndWorker`` works)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from ..config import PipelineSettings, Settings
from ..context.summaries import SummaryWriter
from ..extraction import Extractor
from ..infra.redis_pool import RedisClient
from ..ltm import MemoryService
from ..observability.domain import DomainMetrics
from ..pipelines import (
    LtmPromoter,
    PipelineConfig,
    Promoter,
    QueueMetrics,
    Resumer,
    SessionEndWorker,
    WorkerConfig,
    metering,
)
from ..pipelines.incremental import LearnConfig, Learner, LearnScheduler
from ..pipelines.on_request import EndOnRequest
from ..pipelines.promote import ExtractingPromoter
from ..sessions.ending import SessionEndQueue
from ..sessions.events import EventLog
from ..sessions.lifecycle import Lifecycle
from ..sessions.model import PolicyBook
from ..summarizers import ExtractiveSummarizer, Summarizer
from ..tokens import TokenCounter
from .stores import Stores


@dataclass(frozen=True, slots=True)
class SessionEnd:
    policies: PolicyBook
    events: EventLog
    queue: SessionEndQueue
    summaries: SessionEndQueue  # background summaries' own lane
    lifecycle: Lifecycle
    archive: metering.MeteredArchive
    pipeline: metering.MeteredPipeline
    resumer: Resumer
    on_request: EndOnRequest  # PromoteSession: a forced job, waited for
    scheduler: LearnScheduler | None  # the serving half of learning during the session
    worker: SessionEndWorker  # runs session-end and learn jobs (a worker's half)


def build_session_end(
    settings: Settings,
    redis: RedisClient,
    stores: Stores,
    tokens: TokenCounter,
    *,
    ltm: MemoryService | None,
    extractor: Extractor | None,
    summarizer: Summarizer | None,
    executor: ThreadPoolExecutor,
    metrics: DomainMetrics,
    registry: CollectorRegistry,
) -> SessionEnd:
    """Every part is built, none started (``Lifecycle.start`` and ``LearnScheduler.start`` run once the
    sidecar serves, ``SessionEndWorker.start`` where background work runs)."""
    p = settings.pipeline
    claim_ms = int(p.pipeline_claim_timeout_seconds * 1000)
    policies, events, queue, lifecycle = _lifecycle(settings, redis, stores, claim_ms)
    summaries = SessionEndQueue(redis, stores.keys, key=stores.keys.summary_queue())
    # With the client provider the agent summarizes live turns; at session end nobody is there to
    # ask, so the tail is summarized extractively.
    end_summarizer = metering.MeteredStepSummarizer(
        summarizer or ExtractiveSummarizer(tokens, settings.sessions.default_model, executor), metrics
    )
    promoter = _promoter(stores, ltm, extractor, metrics)
    archive = metering.MeteredArchive(
        p.archive_uri or str(Path(settings.server.data_dir) / "archive"), metrics
    )
    pipeline = _pipeline(
        p,
        stores,
        lifecycle,
        archive,
        summarizer=end_summarizer,
        promoter=promoter,
        claim_ms=claim_ms,
        metrics=metrics,
    )
    resumer = Resumer(stores.sessions, lifecycle, pipeline)
    # Learning during the session, only with something to promote: noticed where appends are served,
    # run where session-end jobs run.
    learns = promoter is not None
    scheduler = LearnScheduler(queue, _learn_config(settings)) if learns else None
    learner = Learner(stores.sessions, pipeline, policies=policies) if learns else None
    worker = SessionEndWorker(
        stores.end_state,
        queue,
        pipeline,
        policies=policies,
        config=_worker_config(settings, claim_ms),
        sessions=stores.sessions,
        events=events,
        metrics=QueueMetrics(registry),
        learner=learner,
        summarize=SummaryWriter(stores.sessions, summarizer, tokens, executor).run if summarizer else None,
        summaries=summaries,
    )
    on_request = EndOnRequest(stores.sessions, lifecycle, queue, stores.end_state, pipeline)
    return SessionEnd(
        policies,
        events,
        queue,
        summaries,
        lifecycle,
        archive,
        pipeline,
        resumer,
        on_request,
        scheduler,
        worker,
    )


def _promoter(
    stores: Stores, ltm: MemoryService | None, extractor: Extractor | None, metrics: DomainMetrics
) -> Promoter | None:
    """Promotion into long-term memory, when there is one; successful sessions also propose an example
    procedure for their agent (pipelines/promote.py, procedures/extract.py)."""
    if ltm is None or extractor is None:
        return None
    return ExtractingPromoter(
        metering.MeteredPromoter(LtmPromoter(ltm, extractor), metrics), stores.procedures
    )


def _lifecycle(
    settings: Settings, redis: RedisClient, stores: Stores, claim_ms: int
) -> tuple[PolicyBook, EventLog, SessionEndQueue, Lifecycle]:
    lc = settings.lifecycle
    policies = PolicyBook.load(
        lc.channel_policies_file, default_expire_after=settings.sessions.session_ttl_seconds
    )
    events = EventLog(redis, stores.keys, max_len=lc.events_max_len)
    queue = SessionEndQueue(redis, stores.keys)
    lifecycle = Lifecycle(
        redis,
        stores.sessions,
        stores.keys,
        policies,
        events=events,
        queue=queue,
        configure_keyspace_events=lc.keyspace_events_configure,
        sweep_interval_s=lc.lifecycle_sweep_interval_seconds,
        dedupe_window_ms=claim_ms,
    )
    return policies, events, queue, lifecycle


def _learn_config(settings: Settings) -> LearnConfig:
    p = settings.pipeline
    return LearnConfig(
        p.learn_every_turns, p.learn_idle_seconds, settings.lifecycle.lifecycle_sweep_interval_seconds
    )


def _pipeline(
    p: PipelineSettings,
    stores: Stores,
    lifecycle: Lifecycle,
    archive: metering.MeteredArchive,
    *,
    summarizer: Summarizer,
    promoter: Promoter | None,
    claim_ms: int,
    metrics: DomainMetrics,
) -> metering.MeteredPipeline:
    return metering.MeteredPipeline(
        stores.sessions,
        lifecycle,
        archive,
        state=stores.end_state,
        traces=stores.traces,
        checkpoints=stores.checkpoints,
        summarizer=summarizer,
        promoter=promoter,
        config=PipelineConfig(
            chunk_messages=p.pipeline_chunk_messages,
            summary_tokens=p.pipeline_summary_tokens,
            lease_ms=claim_ms,
        ),
        metrics=metrics,
    )


def _worker_config(settings: Settings, claim_ms: int) -> WorkerConfig:
    p = settings.pipeline
    return WorkerConfig(
        concurrency=p.pipeline_concurrency,
        claim_timeout_ms=claim_ms,
        retire_interval_s=settings.lifecycle.lifecycle_sweep_interval_seconds,
        retention_interval_s=p.archive_retention_interval_seconds,
        max_failures=p.pipeline_max_failures,
    )
