"""The composition root: settings in, a running sidecar out. The only module that imports everything."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from memlane.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    checkpoint_pb2,
    checkpoint_pb2_grpc,
    context_pb2,
    context_pb2_grpc,
    memory_pb2,
    memory_pb2_grpc,
    procedure_pb2,
    procedure_pb2_grpc,
    session_service_pb2,
    session_service_pb2_grpc,
)

from . import telemetry
from .access.authenticate import Authenticator
from .access.policy import PolicyFile
from .access.user_token import UserTokenRules, load_jwks_file
from .api.admin import AdminServicer
from .api.admission import AdmissionInterceptor, parse_limits
from .api.binding import UserBinding
from .api.checkpoints import CheckpointServicer
from .api.context import ContextServicer
from .api.interceptor import BoundaryInterceptor
from .api.memory_history import MemoryServicerWithHistory
from .api.procedures import ProcedureServicer
from .api.sessions import SessionServicer
from .config import Settings
from .context import ContextAssembler, MemorySource, SummaryScheduler, TraceStore, policy_from_settings
from .context.ltm_source import LtmMemorySource
from .embedding import Embedder, OnnxEmbedder, OnnxModelSpec, Pooling, default_spec
from .extraction import (
    ExtractionMetrics,
    Extractor,
    MeteredExtractor,
    OpenAIExtractor,
    OpenAIExtractorSettings,
    RulesExtractor,
    find_pii,
)
from .infra.embedded_redis import EmbeddedRedis
from .infra.redis_pool import UNAVAILABLE_ERRORS, connect
from .infra.redis_timing import time_commands
from .ltm import LanceMemoryStore, MemoryMaintenance, MemoryPolicy, MemoryService
from .ltm.snapshots import MemorySnapshots
from .observability.admin_http import AdminHttpServer
from .observability.domain import Sampler
from .observability.metrics import RpcMetrics
from .pipelines import (
    LtmPromoter,
    PipelineConfig,
    QueueMetrics,
    Resumer,
    SessionEndWorker,
    WorkerConfig,
)
from .pipelines.incremental import IncrementalLearner, LearnConfig
from .pipelines.user_data import UserData
from .procedures import ExtractingPromoter, Owner, ProcedureService, ProcedureStore
from .sessions.checkpoints import CheckpointStore
from .sessions.durability import Durability
from .sessions.edits import MessageEditor
from .sessions.end_queue import SessionEndQueue
from .sessions.end_state import EndState
from .sessions.events import EventLog
from .sessions.keys import KeySpace
from .sessions.lease import LeaseLock
from .sessions.lifecycle import Lifecycle
from .sessions.limits import Limits
from .sessions.ltm_versions import LtmVersions
from .sessions.memory_history import RedisMemoryHistory
from .sessions.model import Topology
from .sessions.once import OnceMarks
from .sessions.policies import PolicyBook
from .sessions.removal import MessageRemover
from .sessions.store import SessionStore
from .sessions.traces import TraceRecords
from .summarizers import (
    ExtractiveSummarizer,
    MeteredSummarizer,
    OpenAISettings,
    OpenAISummarizer,
    SummarizationMetrics,
    Summarizer,
)
from .tokens import TokenCounter
from .viewer import Viewer, viewer_for

log = logging.getLogger("memlane")


def embedding_spec(s: Settings) -> OnnxModelSpec:
    if not s.embedding_model_path:
        return default_spec()
    base = default_spec()
    return OnnxModelSpec(
        model_path=Path(s.embedding_model_path),
        tokenizer_path=Path(s.embedding_tokenizer_path)
        if s.embedding_tokenizer_path
        else base.tokenizer_path,
        ndims=s.embedding_dims,
        pooling=Pooling(s.embedding_pooling),
        sha256=s.embedding_sha256,
    )


class Sidecar:
    """Owns every resource of one running server. ``start()`` then ``stop()``; ``addresses`` lists the
    bound gRPC endpoints (ports resolved when a listen address asks for port 0)."""

    def __init__(
        self, settings: Settings, *, memory: MemorySource | None = None, embedder: Embedder | None = None
    ) -> None:
        self.settings = settings
        # Long-term memory for context assembly; None leaves the profile and memory sections empty.
        self._memory = memory
        # A caller-owned embedder (tests share one per run); otherwise loaded from settings and owned.
        self._embedder = embedder
        self._owns_embedder = embedder is None
        self.ltm: MemoryService | None = None
        self._ltm_store: LanceMemoryStore | None = None
        self._ltm_maintenance: MemoryMaintenance | None = None
        self._extractor_http: OpenAIExtractor | None = None
        self._openai: OpenAISummarizer | None = None
        self.context: ContextAssembler | None = None
        self.registry, self.metrics = telemetry.new_metrics(settings)
        self._sampler: Sampler | None = None
        self._viewer: Viewer | None = None
        self.addresses: list[str] = []
        self.admin_port: int | None = None
        self._embedded: EmbeddedRedis | None = None
        self._server: grpc.aio.Server | None = None
        self._admin: AdminHttpServer | None = None
        self._health = health.aio.HealthServicer()
        self._executor = ThreadPoolExecutor(settings.executor_threads, thread_name_prefix="memlane-cpu")

    async def start(self) -> None:
        s = self.settings
        await self._connect()
        tokens = await asyncio.to_thread(TokenCounter, s.default_encoding)
        self._build_stores(tokens)
        if s.ltm_enabled:
            await self._build_ltm()
        extractor = self._build_extractor() if self.ltm is not None else None
        summarizer = self._build_summarizer(tokens)
        self._build_lifecycle(tokens, extractor, summarizer)
        self.context = self._build_context(tokens, summarizer)
        telemetry.register_caches(self.registry, self.context, self._memory, self._embedder)

        server, services = self._build_server(extractor, self.context)
        await self._serve(server, services)

    async def _connect(self) -> None:
        """The Redis pool: to ``redis_url``, or to an embedded Redis started under the data dir."""
        redis_url = self.settings.redis_url
        if not redis_url:
            self._embedded = EmbeddedRedis(Path(self.settings.data_dir) / "redis")
            await self._embedded.astart()
            redis_url = self._embedded.url
            log.info("started embedded redis", extra={"url": redis_url})
        self.redis = connect(redis_url)
        time_commands(self.redis, self.metrics.redis_command)
        await self.redis.ping()

    def _build_stores(self, tokens: TokenCounter) -> None:
        """The Redis-backed stores (``sessions/``): sessions, checkpoints, procedures, versions, traces."""
        s = self.settings
        self.keys = KeySpace(s.key_prefix)
        self.sessions = SessionStore(
            self.redis,
            self.keys,
            tokens,
            limits=Limits(
                max_message_bytes=s.max_message_bytes,
                max_batch_messages=s.max_batch_messages,
                max_batch_bytes=s.max_batch_bytes,
            ),
            default_ttl_seconds=s.session_ttl_seconds,
            default_topology=Topology[s.default_topology.upper()],
            executor=self._executor,
            durability=Durability(s.redis_wait_replicas, s.redis_wait_timeout_ms),
        )
        self.checkpoints = CheckpointStore(self.redis, self.keys)
        self.procedures = ProcedureService(
            ProcedureStore(self.redis, self.keys), auto_approve=self._auto_approves, guard=find_pii
        )
        self.memory_history = RedisMemoryHistory(
            self.redis,
            self.keys,
            max_versions=s.ltm_versions_max_per_user,
            max_snapshots=s.ltm_snapshots_max_per_user,
        )
        self.traces = TraceRecords(self.redis, self.keys, s.context_max_traces_per_session)
        self.end_state = EndState(self.redis, self.keys)

    def _build_server(
        self, extractor: Extractor | None, context: ContextAssembler
    ) -> tuple[grpc.aio.Server, list[str]]:
        """The gRPC server with its interceptors and every servicer; the names of the services served."""
        s = self.settings
        metrics = RpcMetrics(self.registry)
        self.admission = AdmissionInterceptor(
            parse_limits(s.admission_limits), s.admission_max_queue, s.admission_max_wait_ms, metrics
        )
        server = grpc.aio.server(
            interceptors=[
                self.admission,  # outermost: a shed call costs nothing more
                BoundaryInterceptor(
                    metrics, self._authenticator(), UserBinding(self.sessions), UNAVAILABLE_ERRORS
                ),
            ],
            options=[
                ("grpc.max_receive_message_length", s.max_receive_message_bytes),
                ("grpc.so_reuseport", 0),  # a second sidecar on the same port must fail, not share it
                ("grpc.keepalive_permit_without_calls", 1),
            ],
        )
        services = self._add_servicers(server, extractor, context)
        reflection.enable_server_reflection(services, server)
        return server, services

    def _add_servicers(
        self, server: grpc.aio.Server, extractor: Extractor | None, context: ContextAssembler
    ) -> list[str]:
        """Every servicer on ``server``; returns the full names of the services it serves."""
        session_service_pb2_grpc.add_SessionServiceServicer_to_server(
            SessionServicer(
                self.sessions,
                lifecycle=self.lifecycle,
                pipeline=self.pipeline,
                resumer=self.resumer,
                remover=MessageRemover(self.redis, self.keys, self.sessions),
                editor=MessageEditor(self.redis, self.keys, self.sessions),
                learner=self.learner,
            ),
            server,
        )
        checkpoint_pb2_grpc.add_CheckpointServiceServicer_to_server(
            CheckpointServicer(self.checkpoints, self.sessions, self.lifecycle, self.resumer), server
        )
        context_pb2_grpc.add_ContextServiceServicer_to_server(
            ContextServicer(context, on_stats=lambda st: telemetry.record_assembly(self.metrics, st)),
            server,
        )
        admin_pb2_grpc.add_AdminServiceServicer_to_server(
            AdminServicer(
                UserData(
                    self.sessions,
                    context.traces,
                    self.ltm,
                    self.archive,
                    caches=[context.forget],
                    history=self.memory_history,
                    procedures=self.procedures,
                    checkpoints=self.checkpoints,
                ),
                self.lifecycle.queue,
            ),
            server,
        )
        if self.ltm is not None and extractor is not None:
            memory_pb2_grpc.add_MemoryServiceServicer_to_server(
                MemoryServicerWithHistory(
                    self.ltm,
                    extractor,
                    OnceMarks(self.redis, self.keys, "feedback"),
                    MemorySnapshots(self.ltm, self.memory_history, self.memory_history),
                ),
                server,
            )
        procedure_pb2_grpc.add_ProcedureServiceServicer_to_server(
            ProcedureServicer(self.procedures, self.sessions), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        services = [
            session_service_pb2.DESCRIPTOR.services_by_name["SessionService"].full_name,
            checkpoint_pb2.DESCRIPTOR.services_by_name["CheckpointService"].full_name,
            context_pb2.DESCRIPTOR.services_by_name["ContextService"].full_name,
            admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
            procedure_pb2.DESCRIPTOR.services_by_name["ProcedureService"].full_name,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ]
        if self.ltm is not None:
            services.append(memory_pb2.DESCRIPTOR.services_by_name["MemoryService"].full_name)
        return services

    async def _serve(self, server: grpc.aio.Server, services: list[str]) -> None:
        """Binds and starts serving, then the admin HTTP server and the background jobs."""
        s = self.settings
        for address in filter(None, (a.strip() for a in s.listen.split(","))):
            self.addresses.append(self._bind(server, address, self._tls_credentials()))
        await server.start()
        self._server = server
        for name in [*services[:2], ""]:
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if s.admin_listen:
            self._admin = AdminHttpServer(self.registry, self._healthy)
            if s.viewer_enabled:
                self._viewer = viewer_for(self._admin, self.addresses, s, self.policy)
            self.admin_port = await self._admin.start(s.admin_listen)
        # Lifecycle jobs start once the sidecar serves: a job may resume sessions that clients then read.
        await self.lifecycle.start()
        if s.pipeline_enabled:
            await self.end_worker.start()
        if self.learner is not None:
            self.learner.start()
        self._sampler = telemetry.start_sampler(
            self.metrics,
            s,
            sessions=self.sessions,
            queue=self._end_queue,
            ltm=self.ltm,
        )
        log.info("memlane serving", extra={"grpc": self.addresses, "admin_port": self.admin_port})

    def _build_lifecycle(
        self, tokens: TokenCounter, extractor: Extractor | None, summarizer: Summarizer | None
    ) -> None:
        s = self.settings
        claim_ms = int(s.pipeline_claim_timeout_seconds * 1000)
        self.policies = PolicyBook.load(s.channel_policies_file, default_expire_after=s.session_ttl_seconds)
        self.session_events = EventLog(self.redis, self.keys, max_len=s.events_max_len)
        queue = self._end_queue = SessionEndQueue(self.redis, self.keys)
        self.lifecycle = Lifecycle(
            self.redis,
            self.sessions,
            self.keys,
            self.policies,
            events=self.session_events,
            queue=queue,
            configure_keyspace_events=s.keyspace_events_configure,
            sweep_interval_s=s.lifecycle_sweep_interval_seconds,
            dedupe_window_ms=claim_ms,
        )
        # Session end has no agent to summarize for it: the "client" provider falls back to extractive.
        # With the client provider the agent summarizes live turns; at session end nobody is there to
        # ask, so the tail is summarized extractively.
        end_summarizer = telemetry.MeteredStepSummarizer(
            summarizer or ExtractiveSummarizer(tokens, s.default_model, self._executor), self.metrics
        )
        promoter = (
            # Successful sessions also propose an example procedure for their agent (procedures/extract.py).
            ExtractingPromoter(
                telemetry.MeteredPromoter(LtmPromoter(self.ltm, extractor), self.metrics), self.procedures
            )
            if self.ltm is not None and extractor is not None
            else None
        )
        self.archive = telemetry.MeteredArchive(
            s.archive_uri or str(Path(s.data_dir) / "archive"), self.metrics
        )
        self.pipeline = telemetry.MeteredPipeline(
            self.sessions,
            self.lifecycle,
            self.archive,
            state=self.end_state,
            traces=self.traces,
            checkpoints=self.checkpoints,
            summarizer=end_summarizer,
            promoter=promoter,
            config=PipelineConfig(
                chunk_messages=s.pipeline_chunk_messages,
                summary_tokens=s.pipeline_summary_tokens,
                lease_ms=claim_ms,
            ),
            metrics=self.metrics,
        )
        self.resumer = Resumer(self.sessions, self.lifecycle, self.pipeline)
        # Learning during the session runs where session-end jobs run, and only with something to promote.
        self.learner = (
            IncrementalLearner(
                self.sessions,
                self.pipeline,
                policies=self.policies,
                config=LearnConfig(
                    s.learn_every_turns, s.learn_idle_seconds, s.lifecycle_sweep_interval_seconds
                ),
            )
            if promoter is not None and s.pipeline_enabled
            else None
        )
        self.end_worker = SessionEndWorker(
            self.end_state,
            queue,
            self.pipeline,
            policies=self.policies,
            config=WorkerConfig(
                concurrency=s.pipeline_concurrency,
                claim_timeout_ms=claim_ms,
                retire_interval_s=s.lifecycle_sweep_interval_seconds,
                retention_interval_s=s.archive_retention_interval_seconds,
                max_failures=s.pipeline_max_failures,
            ),
            sessions=self.sessions,
            events=self.session_events,
            metrics=QueueMetrics(self.registry),
        )

    async def _build_ltm(self) -> None:
        s = self.settings
        if self._embedder is None:
            spec = embedding_spec(s)
            self._embedder = await asyncio.to_thread(
                OnnxEmbedder.load, spec, intra_op_threads=s.embedding_threads
            )
        uri = s.ltm_uri or str(Path(s.data_dir) / "ltm")
        # Every sidecar on this Redis prefix shares the table: one at a time compacts or erases it.
        self._ltm_store = await telemetry.MeteredLanceStore.open_metered(
            self.metrics,
            uri,
            self._embedder.ndims,
            cache_mb=s.ltm_cache_mb,
            lock=LeaseLock(self.redis, self.keys.ltm_lock()),
            read_consistency_s=s.ltm_read_consistency_seconds,
        )
        policy = MemoryPolicy(
            max_items_per_agent=s.ltm_max_items_per_agent,
            max_episodes_per_agent=s.ltm_max_episodes_per_agent,
            duplicate_similarity=s.ltm_duplicate_similarity,
            profile_max_items=s.ltm_profile_max_items,
            expansion_weight=MemoryPolicy().expansion_weight if s.ltm_recall_expansion else 0.0,
        )
        # Every LTM write bumps the user's version in Redis: cached profiles and this (or another)
        # sidecar's LanceDB view are checked against it on the next assembly.
        versions = LtmVersions(self.redis, self.keys)
        self.ltm = MemoryService(
            self._ltm_store,
            self._embedder,
            policy,
            guard=find_pii,
            usage_flush_interval_s=s.ltm_usage_flush_seconds,
            on_change=versions.bump,
            history=self.memory_history,
            hot_index_mb=s.ltm_hot_index_mb,
        )
        self._ltm_maintenance = MemoryMaintenance(
            self.ltm,
            optimize_interval_s=s.ltm_optimize_interval_seconds,
            optimize_after_writes=s.ltm_optimize_after_writes,
            prune_interval_s=s.ltm_prune_interval_seconds,
            vector_index_min_rows=s.ltm_vector_index_min_rows,
        )
        self._ltm_maintenance.start()
        if self._memory is None:
            self._memory = LtmMemorySource(
                self.ltm, cross_channel_episodes=s.ltm_cross_channel_episodes, versions=versions
            )

    def _build_extractor(self) -> Extractor:
        s = self.settings
        extractor: Extractor
        if s.extractor == "rules":
            extractor = RulesExtractor()
        else:
            self._extractor_http = extractor = OpenAIExtractor(
                OpenAIExtractorSettings(
                    base_url=s.extractor_base_url,
                    model=s.extractor_model,
                    api_key=s.extractor_api_key,
                    timeout_s=s.extractor_timeout_seconds,
                )
            )
        return MeteredExtractor(extractor, ExtractionMetrics(self.registry))

    def _build_summarizer(self, tokens: TokenCounter) -> Summarizer | None:
        """The configured provider, metered; None for ``client`` (the agent summarizes)."""
        s = self.settings
        summarizer: Summarizer
        if s.summarizer == "client":
            return None
        if s.summarizer == "openai":
            self._openai = summarizer = OpenAISummarizer(
                OpenAISettings(
                    base_url=s.summarizer_base_url,
                    model=s.summarizer_model,
                    api_key=s.summarizer_api_key,
                    timeout_s=s.summarizer_timeout_seconds,
                ),
                tokens,
            )
        else:
            summarizer = ExtractiveSummarizer(tokens, s.default_model, self._executor)
        return MeteredSummarizer(summarizer, SummarizationMetrics(self.registry))

    def _build_context(self, tokens: TokenCounter, summarizer: Summarizer | None) -> ContextAssembler:
        s = self.settings
        scheduler = (
            SummaryScheduler(self.sessions, summarizer, tokens, self._executor)
            if summarizer is not None
            else None
        )
        return ContextAssembler(
            self.sessions,
            TraceStore(self.traces),
            tokens,
            memory=self._memory,
            scheduler=scheduler,
            policy=policy_from_settings(s),
            system_prompt=s.context_system_prompt,
            default_model=s.default_model,
            max_summary_tokens=s.summary_max_tokens,
            executor=self._executor,
            resume=self.resumer.resume_if_retired,
            policies=self.policies,
            procedures=self.procedures,
            procedures_max_tokens=s.context_procedures_max_tokens,
        )

    def _auto_approves(self, owner: Owner) -> bool:
        """An owner's proposals are active at once: the agent's entry in the access policy, else the
        ``procedure_approval`` setting (group procedures follow the setting)."""
        policy = getattr(self, "policy", None)
        mode = policy.policy.procedure_approval.get(owner.agent_id) if policy and not owner.group else None
        return (mode or self.settings.procedure_approval) == "auto"

    def _authenticator(self) -> Authenticator:
        s = self.settings
        self.policy = PolicyFile(
            Path(s.access_policy_file) if s.access_policy_file else None, s.access_policy_reload_seconds
        )
        self.policy.start()
        if not s.auth_required:
            log.warning(
                "auth is disabled: serving loopback and Unix-socket callers only, identified by the "
                "x-memlane-agent header; set auth_required and access_policy_file in production"
            )
        rules = UserTokenRules(
            required=s.user_token_required,
            file_keys=load_jwks_file(Path(s.user_token_jwks_file)) if s.user_token_jwks_file else (),
            issuer=s.user_token_issuer,
            audience=s.user_token_audience,
        )
        return Authenticator(self.policy, required=s.auth_required, user_tokens=rules)

    def _tls_credentials(self) -> grpc.ServerCredentials | None:
        s = self.settings
        if not s.tls_cert_file:
            return None
        ca = Path(s.tls_client_ca_file).read_bytes() if s.tls_client_ca_file else None
        return grpc.ssl_server_credentials(
            [(Path(s.tls_key_file).read_bytes(), Path(s.tls_cert_file).read_bytes())],
            root_certificates=ca,
            require_client_auth=ca is not None,
        )

    @staticmethod
    def _bind(server: grpc.aio.Server, address: str, tls: grpc.ServerCredentials | None = None) -> str:
        if address.startswith("unix:"):
            path = Path(address[len("unix:") :].removeprefix("//"))
            path.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a stale socket from a crashed run
            server.add_insecure_port(f"unix:{path}")
            return f"unix:{path}"
        port = server.add_secure_port(address, tls) if tls else server.add_insecure_port(address)
        if port == 0:
            raise OSError(f"cannot listen on {address}")
        host = address.rsplit(":", 1)[0]
        return f"{host}:{port}"

    async def _healthy(self) -> bool:
        try:
            return bool(await self.redis.ping())
        except Exception:
            return False

    async def _drain_calls(self, grace: float) -> None:
        """New calls get UNAVAILABLE (retried elsewhere) while the calls in flight finish, within
        ``grace`` in all; then the gRPC server stops (long streams such as WatchSessionEvents end)."""
        assert self._server is not None
        start = time.monotonic()
        if hasattr(self, "admission"):
            await self.admission.drain(grace)
        await self._server.stop(max(0.0, grace - (time.monotonic() - start)))

    async def stop(self) -> None:
        """Health NOT_SERVING first (load balancers stop sending), then drain in-flight calls while
        handing session-end jobs back, then close pools and the embedded Redis. Every step is bounded
        and a failing one does not stop the rest: a shutdown that hangs or gives up half way would
        leave the embedded Redis running or the pod past its termination grace period."""
        await self._health.enter_graceful_shutdown()
        if self._sampler is not None:
            await _bounded("metrics sampler", self._sampler.stop())
        grace = self.settings.shutdown_grace_seconds
        drains = []
        if self._server is not None:
            drains.append(self._drain_calls(grace))
        learner: IncrementalLearner | None = getattr(self, "learner", None)
        if learner is not None:  # an interrupted learning run leaves its turns to the next run
            drains.append(learner.stop())
        if hasattr(self, "end_worker"):
            # Meanwhile session-end jobs go back to the queue (leases released) for another sidecar.
            drains.append(self.end_worker.stop())
        await _bounded("drain", asyncio.gather(*drains), grace + _STEP_SECONDS)
        for name, close in self._closers():
            await _bounded(name, close())
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _closers(self) -> list[tuple[str, Callable[[], Awaitable[object]]]]:
        """What ``stop`` closes after the drain, in order; a part that never started is absent."""
        parts: list[tuple[str, Callable[[], Awaitable[object]] | None]] = [
            ("policy reload", self.policy.stop if hasattr(self, "policy") else None),
            ("lifecycle", self.lifecycle.stop if hasattr(self, "lifecycle") else None),
            ("admin http", self._admin.stop if self._admin is not None else None),
            ("viewer", self._viewer.close if self._viewer is not None else None),
            # background summarizations in flight
            ("context", self.context.aclose if self.context is not None else None),
            ("openai client", self._openai.aclose if self._openai is not None else None),
            ("ltm maintenance", self._ltm_maintenance.close if self._ltm_maintenance is not None else None),
            ("ltm", self.ltm.close if self.ltm is not None else None),  # flushes pending usage bumps
            ("ltm store", _async(self._ltm_store.close) if self._ltm_store is not None else None),
            ("extractor http", self._extractor_http.aclose if self._extractor_http is not None else None),
            (
                "embedder",
                self._embedder.close if self._embedder is not None and self._owns_embedder else None,
            ),
            ("redis pool", self.redis.aclose if hasattr(self, "redis") else None),
            ("embedded redis", self._embedded.astop if self._embedded is not None else None),
        ]
        return [(name, close) for name, close in parts if close is not None]


# One shutdown step's limit: a step that needs longer is stuck (its name is logged) and skipped.
_STEP_SECONDS = 15.0


async def _bounded(name: str, step: Awaitable[object], limit: float = _STEP_SECONDS) -> None:
    started = time.monotonic()
    try:
        async with asyncio.timeout(limit):  # not wait_for: on 3.11 it can swallow a cancellation
            await step
    except TimeoutError:
        log.error("shutdown: %s did not finish within %.0f s; going on without it", name, limit)
    except Exception:
        log.exception("shutdown: %s failed; going on", name)
    else:
        if (took := time.monotonic() - started) > 2.0:
            log.warning("shutdown: %s took %.1f s", name, took)


def _async(close: Callable[[], object]) -> Callable[[], Awaitable[object]]:
    async def run() -> object:
        return close()

    return run


async def serve(settings: Settings) -> None:
    """Runs until SIGINT or SIGTERM, then shuts down gracefully."""
    sidecar = Sidecar(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await sidecar.start()
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await sidecar.stop()
