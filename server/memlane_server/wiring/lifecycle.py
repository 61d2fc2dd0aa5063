"""The work done on a session's turns: the providers (the memory extractor and the summarizer), context
assembly while the session is open, and the session's lifecycle with the session-end pipeline (expiry and
sweeps, the job queue and its worker, the archive, resumption and learning during the session).

The same lifecycle parts are built in the serving process and in a worker process; each starts its own
half (``Lifecycle`` and ``LearnScheduler`` serve, ``SessionEndWorker`` works). The component configs of
this work (``BudgetPolicy``, ``PipelineConfig``, ``WorkerConfig``, ``LearnConfig``, the providers'
endpoints) are built here from the settings and nowhere else; tests build theirs with the same functions."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from ..config import ContextSettings, ExtractionSettings, PipelineSettings, Settings, SummarizationSettings
from ..context import ContextAssembler, MemorySource, SummaryScheduler, TraceStore
from ..context.budget import BudgetPolicy
from ..context.model import Fallback, Strategy, parse_strategy
from ..context.summaries import SummaryWriter
from ..errors import InvalidArgument
from ..extraction import (
    ExtractionMetrics,
    Extractor,
    MeteredExtractor,
    OpenAIExtractor,
    OpenAIExtractorSettings,
    RulesExtractor,
)
from ..extraction.rules import PROVIDER as RULES_PROVIDER
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
from ..summarizers import (
    ExtractiveSummarizer,
    MeteredSummarizer,
    OpenAISettings,
    OpenAISummarizer,
    SummarizationMetrics,
    Summarizer,
)
from ..tokens import TokenCounter
from .stores import Stores


@dataclass(frozen=True, slots=True)
class SessionEnd:
    policies: PolicyBook
    events: EventLog
    queue: SessionEndQueue
    summaries: SessionEndQueue  # background summaries' own lane
    facts: SessionEndQueue  # facts jobs' own lane (a user turn's facts at once)
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
    claim_ms = _claim_ms(p)
    policies, events, queue, lifecycle = _lifecycle(settings, redis, stores, claim_ms)
    summaries = SessionEndQueue(redis, stores.keys, key=stores.keys.summary_queue())
    facts = SessionEndQueue(
        redis, stores.keys, key=stores.keys.facts_queue(), marker=stores.keys.facts_marker
    )
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
        metrics=metrics,
    )
    resumer = Resumer(stores.sessions, lifecycle, pipeline)
    # Learning during the session, only with something to promote: noticed where appends are served,
    # run where session-end jobs run.
    learns = promoter is not None
    facts_promoter = _facts_promoter(ltm, extractor)
    scheduler = (
        LearnScheduler(
            queue,
            learn_config(settings),
            facts=facts if facts_promoter is not None else None,
            facts_wait_ms=claim_ms,
        )
        if learns
        else None
    )
    learner = (
        Learner(
            stores.sessions,
            pipeline,
            policies=policies,
            state=stores.end_state,
            promoter=_promoter(stores, ltm, extractor, metrics, learnt=True),
            facts=facts_promoter,
            facts_queue=facts,
        )
        if learns
        else None
    )
    worker = SessionEndWorker(
        stores.end_state,
        queue,
        pipeline,
        policies=policies,
        config=worker_config(settings),
        sessions=stores.sessions,
        events=events,
        metrics=QueueMetrics(registry),
        learner=learner,
        summarize=SummaryWriter(stores.sessions, summarizer, tokens, executor).run if summarizer else None,
        summaries=summaries,
        facts=facts,
    )
    on_request = EndOnRequest(stores.sessions, lifecycle, queue, stores.end_state, pipeline)
    return SessionEnd(
        policies,
        events,
        queue,
        summaries,
        facts,
        lifecycle,
        archive,
        pipeline,
        resumer,
        on_request,
        scheduler,
        worker,
    )


def _promoter(
    stores: Stores,
    ltm: MemoryService | None,
    extractor: Extractor | None,
    metrics: DomainMetrics,
    *,
    learnt: bool = False,
) -> Promoter | None:
    """Promotion into long-term memory, when there is one; successful sessions also propose an example
    procedure for their agent (pipelines/promote.py, procedures/service.py). ``learnt``: learning's
    (an open session's), whose writes readers take in behind their reads."""
    if ltm is None or extractor is None:
        return None
    inner = LtmPromoter(ltm, extractor, learnt=learnt)
    return ExtractingPromoter(metering.MeteredPromoter(inner, metrics), stores.procedures)


def _facts_promoter(ltm: MemoryService | None, extractor: Extractor | None) -> Promoter | None:
    """Facts at once: facts and preferences without episodes, with the rules extractor only (a few ms
    of regexes per turn; a model extractor keeps to the learn thresholds rather than a call per turn)."""
    if ltm is None or extractor is None or extractor.provider != RULES_PROVIDER:
        return None
    return LtmPromoter(ltm, extractor, episodes=False, learnt=True)


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


def _pipeline(
    p: PipelineSettings,
    stores: Stores,
    lifecycle: Lifecycle,
    archive: metering.MeteredArchive,
    *,
    summarizer: Summarizer,
    promoter: Promoter | None,
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
        config=pipeline_config(p),
        metrics=metrics,
    )


# --- the providers ---------------------------------------------------------------------------------------
# The configured memory extractor and summarizer, each metered. An HTTP provider is also returned bare, so
# the sidecar closes its client at shutdown.


def build_extractor(
    s: ExtractionSettings, registry: CollectorRegistry
) -> tuple[Extractor, OpenAIExtractor | None]:
    if s.extractor == "rules":
        return MeteredExtractor(RulesExtractor(), ExtractionMetrics(registry)), None
    http = OpenAIExtractor(extractor_endpoint(s))
    return MeteredExtractor(http, ExtractionMetrics(registry)), http


def build_summarizer(
    s: SummarizationSettings,
    tokens: TokenCounter,
    *,
    default_model: str,
    executor: ThreadPoolExecutor,
    registry: CollectorRegistry,
) -> tuple[Summarizer | None, OpenAISummarizer | None]:
    """None for ``client`` (the agent summarizes)."""
    if s.summarizer == "client":
        return None, None
    http: OpenAISummarizer | None = None
    summarizer: Summarizer
    if s.summarizer == "openai":
        summarizer = http = OpenAISummarizer(summarizer_endpoint(s), tokens)
    else:
        summarizer = ExtractiveSummarizer(tokens, default_model, executor)
    return MeteredSummarizer(summarizer, SummarizationMetrics(registry)), http


# --- context assembly: the assembler over the stores, long-term memory and the summary scheduler -------


def build_context(
    c: ContextSettings,
    stores: Stores,
    tokens: TokenCounter,
    *,
    summarizer: Summarizer | None,
    memory: MemorySource | None,
    default_model: str,
    executor: ThreadPoolExecutor,
    resumer: Resumer,
    policies: PolicyBook,
    queue: SessionEndQueue,
) -> ContextAssembler:
    # The summaries themselves are written by a worker (wiring/lifecycle.py: SummaryWriter).
    scheduler = SummaryScheduler(queue) if summarizer is not None else None
    return ContextAssembler(
        stores.sessions,
        TraceStore(stores.traces),
        tokens,
        memory=memory,
        scheduler=scheduler,
        policy=budget_policy(c),
        system_prompt=c.context_system_prompt,
        default_model=default_model,
        max_summary_tokens=c.summary_max_tokens,
        executor=executor,
        resume=resumer.resume_if_retired,
        policies=policies,
        procedures=stores.procedures,
        procedures_max_tokens=c.context_procedures_max_tokens,
    )


# --- the component configs: each setting becomes a component's value here, and nowhere else ------------


def budget_policy(c: ContextSettings) -> BudgetPolicy:
    """The policy the configured settings describe; raises ``InvalidArgument`` naming a bad setting."""
    fallbacks = {"gap_summary": Fallback.GAP_SUMMARY, "drop_oldest": Fallback.DROPPED_OLDEST}
    if c.context_fallback not in fallbacks:
        raise InvalidArgument(f"context_fallback: expected one of {', '.join(fallbacks)}")
    if not 0 < c.context_summary_trigger_ratio <= 1:
        raise InvalidArgument("context_summary_trigger_ratio: must be in (0, 1]")
    if not 0 <= c.context_memory_min_similarity < 1:
        raise InvalidArgument("context_memory_min_similarity: must be in [0, 1)")
    return BudgetPolicy(
        memory_min_similarity=c.context_memory_min_similarity,
        default_reserved_output=c.context_reserved_output_tokens,
        trigger_ratio=c.context_summary_trigger_ratio,
        window_turns=c.context_window_turns,
        default_strategy=parse_strategy(c.context_strategy, "context_strategy") or Strategy.HYBRID,
        fallback=fallbacks[c.context_fallback],
    )


def _claim_ms(p: PipelineSettings) -> int:
    """The claim timeout: a dead sidecar's job and its session lease are taken over after it."""
    return int(p.pipeline_claim_timeout_seconds * 1000)


def pipeline_config(p: PipelineSettings) -> PipelineConfig:
    return PipelineConfig(
        chunk_messages=p.pipeline_chunk_messages,
        summary_tokens=p.pipeline_summary_tokens,
        lease_ms=_claim_ms(p),
    )


def worker_config(settings: Settings) -> WorkerConfig:
    p = settings.pipeline
    return WorkerConfig(
        concurrency=p.pipeline_concurrency,
        claim_timeout_ms=_claim_ms(p),
        retire_interval_s=settings.lifecycle.lifecycle_sweep_interval_seconds,
        retention_interval_s=p.archive_retention_interval_seconds,
        max_failures=p.pipeline_max_failures,
    )


def learn_config(settings: Settings) -> LearnConfig:
    p = settings.pipeline
    return LearnConfig(
        every_turns=p.learn_every_turns,
        idle_s=p.learn_idle_seconds,
        tick_s=settings.lifecycle.lifecycle_sweep_interval_seconds,
        facts=p.learn_facts_on_append,
    )


def extractor_endpoint(s: ExtractionSettings) -> OpenAIExtractorSettings:
    return OpenAIExtractorSettings(
        base_url=s.extractor_base_url,
        model=s.extractor_model,
        api_key=s.extractor_api_key,
        timeout_s=s.extractor_timeout_seconds,
    )


def summarizer_endpoint(s: SummarizationSettings) -> OpenAISettings:
    return OpenAISettings(
        base_url=s.summarizer_base_url,
        model=s.summarizer_model,
        api_key=s.summarizer_api_key,
        timeout_s=s.summarizer_timeout_seconds,
    )
