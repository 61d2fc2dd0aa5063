"""The composition root: settings in, a running sidecar out. The builders of each part live in
``wiring/``; this module calls them in order, starts the background jobs once the sidecar serves, and
stops everything in a fixed order.

Serving apart from work: the serving process answers requests; the background jobs (session end,
learning during the session, LTM upkeep) run in ``worker_processes`` child processes (``children.py``,
each a ``cli.start.Worker``), fed through the job stream in Redis. With ``worker_processes`` 0 they run in
this process instead, through the same stream."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, get_args

import grpc

from . import children, preflight, telemetry
from .access.policy import PolicyFile
from .api.admission import AdmissionInterceptor
from .children import ModelProcess, WorkerPool
from .config import Settings
from .context import ContextAssembler, MemorySource
from .context.sources import LtmMemorySource
from .embedding import Embedder
from .embedding.admission import EmbeddingAdmission
from .embedding.remote import RemoteEmbedder
from .errors import MemlaneError
from .extraction import Extractor
from .infra.periodic import Periodic
from .infra.redis_pool import RedisClient, backend_fault, connect, time_commands, unanswered
from .infra.redis_server import DurableWrites, EmbeddedRedis
from .keyspace import KeySpace
from .ltm import MemoryMaintenance, MemoryService
from .ltm.redis_state import LtmVersions
from .observability import spans
from .observability.domain import Sampler
from .observability.health import PodHealth, PodMetrics
from .observability.http_endpoint import HttpEndpoint
from .procedures import Owner
from .sessions.lifecycle import Lifecycle
from .sessions.store import SessionStore
from .summarizers import Summarizer
from .supervision import PartMetrics
from .tokens import TokenCounter
from .viewer import viewer_for
from .wiring import grpc_server
from .wiring import stores as wiring_stores
from .wiring.connections import TICK_S as CONNECTIONS_TICK_S
from .wiring.connections import ConnectionGate
from .wiring.embedding import load_embedder
from .wiring.lifecycle import SessionEnd, build_context, build_extractor, build_session_end, build_summarizer
from .wiring.stores import Stores, build_stores

log = logging.getLogger("memlane")

Close = Callable[[], Awaitable[object]]

# What ``stop`` drains, within the grace period, in two phases: first the calls in flight and the learn
# scheduler (the workers keep working meanwhile: a PromoteSession in flight waits for its job), then the
# worker processes and this process's own job consumer, which hand their jobs back to the queue.
DrainStep = Literal["calls", "learn scheduler", "workers", "session-end worker"]
_CALLS_PHASE: tuple[DrainStep, ...] = ("calls", "learn scheduler")
# What ``stop`` closes after the drain, in this order; a part that never started is absent. Literal
# types, so a part registered under a name missing here fails the type check instead of staying open.
CloseStep = Literal[
    "memory trim",  # a worker's (cli/start.py)
    "erasure resume",
    "grpc connections",
    "policy reload",
    "lifecycle",
    "admin http",
    "viewer",
    "context",  # background summarizations in flight
    "openai client",
    "ltm maintenance",
    "ltm",  # flushes pending usage bumps
    "ltm store",
    "extractor http",
    "embedder",
    "model process",  # after the workers and this process stopped asking it
    "redis pool",
    "embedded redis",
    "data dir lock",
    "heartbeat",  # a worker's, last: a long shutdown is not a stall
]
_DRAIN_ORDER: tuple[DrainStep, ...] = get_args(DrainStep)
_CLOSE_ORDER: tuple[CloseStep, ...] = get_args(CloseStep)


class Sidecar:
    """Owns every resource of one running server. ``start()`` then ``stop()``; ``addresses`` lists the
    bound gRPC endpoints (ports resolved when a listen address asks for port 0). Each part, once built,
    registers how it is drained or closed, so ``stop`` after a failed ``start`` closes what exists."""

    # Whether this process answers calls (every append counts tokens) or only runs background jobs.
    _serves_requests = True

    @property
    def _shares_model(self) -> bool:
        """Worker processes will embed too: the model runs in a process of its own, once."""
        p = self.settings.pipeline
        return p.pipeline_enabled and p.worker_processes > 0

    # Set by start(); tests and tools read them from a started sidecar.
    redis: RedisClient
    stores: Stores
    keys: KeySpace
    sessions: SessionStore
    end: SessionEnd
    lifecycle: Lifecycle
    admission: AdmissionInterceptor

    def __init__(
        self, settings: Settings, *, memory: MemorySource | None = None, embedder: Embedder | None = None
    ) -> None:
        self.settings = settings
        # Long-term memory for context assembly; None leaves the profile and memory sections empty.
        self._memory = memory
        # A caller-owned embedder (tests share one per run); otherwise loaded from settings and owned.
        self._embedder = embedder
        self.ltm: MemoryService | None = None
        self.context: ContextAssembler | None = None
        self.registry, self.metrics = telemetry.new_metrics(settings)
        self._sampler: Sampler | None = None
        self._maintenance: MemoryMaintenance | None = None
        self._admin: HttpEndpoint | None = None
        self._redis_url = ""  # the Redis every process of this sidecar uses (an embedded one's too)
        # Its own Redis's persistence is this sidecar's to vouch for: a write is answered once it is in
        # the AOF, and a full disk answers STORAGE_FULL whatever the fsync setting
        # (infra/redis_server.DurableWrites, EmbeddedRedis.fault). An external Redis's files are its
        # operator's.
        self._durable: DurableWrites | None = None
        self._backend_fault: Callable[[BaseException], MemlaneError | None] = backend_fault
        self._stop_deadline = 0.0  # monotonic time by which the drain must be over (set by stop)
        self._policy: PolicyFile | None = None
        self.addresses: list[str] = []
        self.admin_port: int | None = None
        # A worker process serves no gRPC and supervises no child: it exports none of the pod's own gauges
        # (a health gauge of its own read 0 while all was well, and min() over the pod with it).
        pod_registry = self.registry if self._serves_requests else None
        self._pod = PodMetrics(pod_registry)
        self._parts = PartMetrics(pod_registry)
        self._health = PodHealth(self._pod)  # the verdict of the checks that ``_connect`` and others add
        self._dir_lock: preflight.DataDirLock | None = None  # held with an embedded Redis
        self._executor = ThreadPoolExecutor(
            settings.server.executor_threads, thread_name_prefix="memlane-cpu"
        )
        self._model: ModelProcess | None = None  # with worker processes: the pod's one model
        self._drains: dict[DrainStep, Close] = {}  # registered as each part is built
        self._closes: dict[CloseStep, Close] = {}

    async def start(self) -> None:
        s = self.settings
        await self._preflight(listens=True)
        tokens, extractor, summarizer = await self._foundation()
        self.context = build_context(
            s.context,
            self.stores,
            tokens,
            summarizer=summarizer,
            memory=self._memory,
            default_model=s.sessions.default_model,
            executor=self._executor,
            resumer=self.end.resumer,
            policies=self.end.policies,
            queue=self.end.summaries,
        )
        self._closes["context"] = self.context.aclose
        telemetry.register_caches(self.registry, self.context, self._memory, self._embedder)
        await self._serve(extractor, self.context)
        await self._start_admin()
        await self._start_jobs()
        log.info("memlane serving", extra={"grpc": self.addresses, "admin_port": self.admin_port})

    async def _preflight(self, *, listens: bool) -> None:
        """Configuration, the data dir, ports and Redis first (preflight.py): a start that cannot work
        fails in about two seconds with one line, before the model loads or a Redis starts."""
        path = await preflight.check(self.settings, listens=listens)
        if not self.settings.redis.redis_url:  # this sidecar will run the embedded Redis on these files
            lock = preflight.DataDirLock(path)
            lock.acquire()
            self._dir_lock = lock
            self._closes["data dir lock"] = _async(lock.release)

    async def _foundation(self) -> tuple[TokenCounter, Extractor | None, Summarizer | None]:
        """What both halves need: Redis, the stores, long-term memory, the providers and the session-end
        parts (built, not started)."""
        s = self.settings
        if s.ltm.ltm_enabled and self._embedder is None and self._shares_model:
            # Started first: the model loads in its own process while Redis starts and the table opens.
            self._model = model = ModelProcess(s, self._parts)
            self._closes["model process"] = model.stop
            await model.start()
        preload = s.sessions.preload_encodings.split(",") if self._serves_requests else []
        # Beside Redis's start: building the encodings takes 1-2 s of CPU, mostly native.
        building = asyncio.ensure_future(
            asyncio.to_thread(
                TokenCounter,
                s.sessions.default_encoding,
                preload=tuple(n.strip() for n in preload if n.strip()),
            )
        )
        try:
            await self._connect()
        finally:
            tokens = await building
        if self._serves_requests:
            # What the builds freed (their ranks dicts, ~7 MB) goes back now: later the serving process
            # does not trim (children.TRIM_INTERVAL_S), and nothing is served yet to wait on the lock.
            await children.return_freed_memory()
        self.stores = build_stores(
            self.redis, tokens, s, executor=self._executor, auto_approve=self._auto_approves
        )
        self.keys, self.sessions = self.stores.keys, self.stores.sessions
        if s.ltm.ltm_enabled:
            await self._open_ltm()
        extractor = self._extractor() if self.ltm is not None else None
        summarizer = self._summarizer(tokens)
        self._build_session_end(tokens, extractor, summarizer)
        return tokens, extractor, summarizer

    async def _connect(self) -> None:
        """The Redis pool: to ``redis_url``, or to an embedded Redis started under the data dir (it holds
        the data dir's lock with this process, dies with it and is started again if it dies alone)."""
        redis_url = self.settings.redis.redis_url
        embedded: EmbeddedRedis | None = None
        if not redis_url:
            lock = self._dir_lock
            embedded = EmbeddedRedis(
                Path(self.settings.server.data_dir) / "redis",
                lock_fd=lock.fd if lock else None,
                fsync=self.settings.redis.embedded_redis_fsync,
            )
            self._closes["embedded redis"] = embedded.astop
            await embedded.astart()
            redis_url = embedded.url
            log.info("started embedded redis", extra={"url": redis_url})
            embedded.supervise(on_exit=lambda _: self._pod.redis_restarts.inc(), on_start=self._noted)
            self._noted(embedded.pid)
            self._health.add_check("embedded redis", embedded.health)
            full_disk = embedded.fault  # STORAGE_FULL also for a Redis that exited on a full disk
            self._backend_fault = lambda exc: full_disk(exc) or backend_fault(exc)
        self._redis_url = redis_url
        self._health.add_check("redis", self._redis_answers)
        self.redis = connect(redis_url)
        self._closes["redis pool"] = self.redis.aclose
        time_commands(self.redis, self.metrics.redis_command, spans.redis_call)
        if embedded is not None:
            self._durable = DurableWrites(embedded, self.redis)
        await self.redis.ping()

    async def _open_ltm(self) -> None:
        s = self.settings
        if self._embedder is None and self._model is not None:
            # One model per pod: this process and its workers embed through the model process.
            # A query waits no longer for a restarting model process than for a silent one: UNAVAILABLE.
            wait_s = s.embedding.embedding_call_timeout_seconds
            self._embedder = remote = await RemoteEmbedder.connect(
                self._model.socket, bulk=False, silence_s=wait_s, reconnect_s=wait_s
            )
            self._closes["embedder"] = remote.close
            self._health.add_check("model process", self._model.health)
        elif self._embedder is None:
            self._embedder = embedder = await load_embedder(s.embedding)
            self._closes["embedder"] = embedder.close
        assert self._embedder is not None
        telemetry.register_embedding(self.registry, self._embedder)
        store = await wiring_stores.open_store(
            s.ltm,
            data_dir=s.server.data_dir,
            ndims=self._embedder.ndims,
            redis=self.redis,
            keys=self.keys,
            metrics=self.metrics,
        )
        self._closes["ltm store"] = _async(store.close)
        self._health.add_check("ltm", store.health)
        versions = LtmVersions(self.redis, self.keys)
        self.ltm = wiring_stores.memory_service(
            s.ltm, store, self._embedder, versions=versions, history=self.stores.memory_history
        )
        self._closes["ltm"] = self.ltm.close
        self._maintenance = maintenance = wiring_stores.maintenance(s.ltm, self.ltm)  # started with the jobs
        self._closes["ltm maintenance"] = maintenance.close
        if self._memory is None:
            self._memory = LtmMemorySource(self.ltm, cross_channel_episodes=s.ltm.ltm_cross_channel_episodes)

    def _extractor(self) -> Extractor:
        extractor, http = build_extractor(self.settings.extraction, self.registry)
        if http is not None:
            self._closes["extractor http"] = http.aclose
        return extractor

    def _summarizer(self, tokens: TokenCounter) -> Summarizer | None:
        """The configured provider, metered; None for ``client`` (the agent summarizes)."""
        summarizer, http = build_summarizer(
            self.settings.summarization,
            tokens,
            default_model=self.settings.sessions.default_model,
            executor=self._executor,
            registry=self.registry,
        )
        if http is not None:
            self._closes["openai client"] = http.aclose
        return summarizer

    def _build_session_end(
        self, tokens: TokenCounter, extractor: Extractor | None, summarizer: Summarizer | None
    ) -> None:
        self.end = build_session_end(
            self.settings,
            self.redis,
            self.stores,
            tokens,
            ltm=self.ltm,
            extractor=extractor,
            summarizer=summarizer,
            executor=self._executor,
            metrics=self.metrics,
            registry=self.registry,
        )
        self.lifecycle = self.end.lifecycle
        self._closes["lifecycle"] = self.lifecycle.stop
        if self.end.scheduler is not None:  # notices not queued yet are left to the session end
            self._drains["learn scheduler"] = self.end.scheduler.stop
        # Meanwhile jobs in flight go back to the queue (leases released) for another worker.
        self._drains["session-end worker"] = self.end.worker.stop

    async def _serve(self, extractor: Extractor | None, context: ContextAssembler) -> None:
        """The gRPC server: built, bound and started; health SERVING."""
        s = self.settings
        self._policy = grpc_server.start_policy(s.access)
        self._closes["policy reload"] = self._policy.stop
        listens = [a.strip() for a in s.server.listen.split(",") if a.strip()]
        gate = ConnectionGate(len(listens), self._pod)
        server, self.admission = grpc_server.new_server(
            s.server,
            self.registry,
            grpc_server.authenticator(s.access, self._policy),
            self.stores,
            gate,
            durable=self._durable,
            backend_fault=self._backend_fault,
        )
        self._user_data = grpc_server.user_data(self.redis, self.stores, context, self.ltm, self.end)
        served = grpc_server.Served(
            self.redis,
            self.stores,
            self.end,
            context,
            self.ltm,
            extractor,
            self.metrics,
            self._health,
            self._user_data,
            EmbeddingAdmission(
                max_length=getattr(self._embedder, "max_length", _DEFAULT_MAX_LENGTH),
                max_call_tokens=s.embedding.embedding_max_call_tokens,
                max_inflight_tokens=s.embedding.embedding_max_inflight_tokens,
                max_wait_s=s.server.admission_max_wait_ms / 1000,  # as long as a call waits at its gate
            ),
        )
        services = grpc_server.add_servicers(server, served)
        for address in listens:
            self.addresses.append(grpc_server.bind(server, address, grpc_server.tls_credentials(s.access)))
        await server.start()
        self._drains["calls"] = functools.partial(self._drain_calls, server, s.server.shutdown_grace_seconds)
        await self._health.serve([*services[:2], ""])
        gate.watch(self.addresses)
        self._health.add_check("grpc connections", gate.health)
        connections = Periodic("grpc connections", gate.tick, CONNECTIONS_TICK_S)
        self._closes["grpc connections"] = connections.stop
        connections.start()

    async def _start_admin(self, *, with_viewer: bool = True) -> None:
        """/metrics, /healthz and the memory viewer over HTTP, when an admin address is set."""
        s = self.settings
        if not s.server.admin_listen:
            return
        self._admin = admin = HttpEndpoint(self.registry, self._healthy)
        self._closes["admin http"] = admin.stop
        if with_viewer and s.observability.viewer_enabled:
            assert self._policy is not None  # started by _serve
            viewer = viewer_for(admin, self.addresses, s.access, self._policy)
            if viewer is not None:
                self._closes["viewer"] = viewer.close
        self.admin_port = await admin.start(s.server.admin_listen)

    async def _start_jobs(self) -> None:
        """Lifecycle jobs start once the sidecar serves: a job may resume sessions that clients then
        read. The background jobs run in worker processes, or here with ``worker_processes`` 0."""
        await self.lifecycle.start()
        if self.end.scheduler is not None:
            self.end.scheduler.start()
        # Erasures a dead sidecar left half done are finished here (the journal: sessions/leases.py).
        erasures = Periodic("erasure-resume", self._user_data.resume_orphans, _ERASURE_RESUME_S)
        self._closes["erasure resume"] = erasures.stop
        erasures.start()
        p = self.settings.pipeline
        if p.pipeline_enabled and p.worker_processes > 0:
            pool = WorkerPool(
                self.settings,
                redis_url=self._redis_url,
                processes=p.worker_processes,
                metrics=self._parts,
                embedder_socket=self._model.socket if self._model is not None else "",
            )
            self._health.add_check("worker processes", pool.health)
            self._drains["workers"] = lambda: pool.stop(self._stop_deadline)
            await pool.start()
            if self._admin is not None:
                self._admin.serve_metrics_of(pool.metrics)
        elif p.pipeline_enabled:
            await self._start_background()
        self._sampler = telemetry.start_sampler(
            self.metrics,
            self.settings.observability,
            sessions=self.sessions,
            queue=self.end.queue,
            ltm=self.ltm,
        )

    async def _start_background(self) -> None:
        """This process takes background jobs: the job stream's consumer, retirement, archive retention
        and the LTM table's upkeep."""
        await self.end.worker.start()
        if self._maintenance is not None:
            self._maintenance.start()

    def _auto_approves(self, owner: Owner) -> bool:
        """An owner's proposals are active at once: the agent's entry in the access policy, else the
        ``procedure_approval`` setting (group procedures follow the setting)."""
        policy = self._policy
        mode = policy.policy.procedure_approval.get(owner.agent_id) if policy and not owner.group else None
        return (mode or self.settings.access.procedure_approval) == "auto"

    async def _healthy(self) -> list[str]:
        """Why this process cannot serve (empty: it can): the checks' verdict (observability/health.py)."""
        return await self._health.reasons()

    async def _redis_answers(self) -> str | None:
        """Redis answers through a new connection, not only a pooled one (a pooled connection outlives a
        deleted socket file), and takes writes (a full disk makes it answer PING with MISCONF)."""
        why = await unanswered(self._redis_url, _REDIS_CHECK_S)
        return None if why is None else f"redis does not answer a new connection: {why}"

    def _noted(self, pid: int | None) -> None:
        if self._dir_lock is not None:
            self._dir_lock.note_redis(pid)

    async def _drain_calls(self, server: grpc.aio.Server, grace: float) -> None:
        """New calls get UNAVAILABLE (retried elsewhere) and WatchSessionEvents streams end at once,
        while the calls in flight get ``grace`` to finish; any still running then is answered
        UNAVAILABLE (api/admission.py ``drain``). Then the gRPC server stops: every memlane call has been
        answered by then, and what is left (health checks, a health Watch stream) gets a second at most,
        not the rest of the grace."""
        await self.admission.drain(grace)
        await server.stop(1.0)

    async def stop(self) -> None:
        """Health NOT_SERVING first (load balancers stop sending), then drain in-flight calls, then hand
        the jobs in flight back (workers stopped), then close pools and the embedded Redis. Every step is
        bounded and a failing one does not stop the rest: a shutdown that hangs or gives up half way
        would leave the embedded Redis running or the pod past its termination grace period."""
        await self._health.enter_graceful_shutdown()
        if self._sampler is not None:
            await _bounded("metrics sampler", self._sampler.stop())
        grace = self.settings.server.shutdown_grace_seconds
        self._stop_deadline = time.monotonic() + grace
        for phase in (_CALLS_PHASE, tuple(n for n in _DRAIN_ORDER if n not in _CALLS_PHASE)):
            drains = [self._drains[name]() for name in phase if name in self._drains]
            await _bounded("drain", asyncio.gather(*drains), grace + _STEP_SECONDS)
        for name in _CLOSE_ORDER:
            if (close := self._closes.get(name)) is not None:
                await _bounded(name, close())
        self._executor.shutdown(wait=False, cancel_futures=True)


_DEFAULT_MAX_LENGTH = 256  # the admission's token estimate without a model (long-term memory off)
_REDIS_CHECK_S = 2.0  # a health check's PING through a new connection; longer: Redis cannot serve
_ERASURE_RESUME_S = 10.0  # how often half-done erasures are looked for (one HKEYS when there are none)

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


def _async(close: Callable[[], object]) -> Close:
    async def run() -> object:
        return close()

    return run


async def run_until_signalled(runtime: Sidecar, *, parent_pid: int = 0) -> None:
    """Runs a started sidecar or worker until SIGINT or SIGTERM, or until the process ``parent_pid`` is
    gone (a worker of ``memlane serve`` outlives no serving process, even one killed with SIGKILL), then
    shuts it down gracefully (also after a failed start: whatever it started is stopped)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    orphaned = asyncio.create_task(children.parent_gone(parent_pid, stop)) if parent_pid else None
    try:
        await runtime.start()
        await stop.wait()
    finally:
        log.info("shutting down")
        if orphaned is not None:
            orphaned.cancel()
        await runtime.stop()
