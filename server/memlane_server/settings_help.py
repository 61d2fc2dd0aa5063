"""One sentence per setting, shown by ``memlane serve --help`` (with the allowed values, the variable and
the default). tests/unit/test_cli.py checks every setting has one."""

from __future__ import annotations

HELP: dict[str, str] = {
    "listen": "gRPC addresses, comma-separated; unix:/path/memlane.sock for a Unix socket.",
    "admin_listen": "HTTP address of /metrics, /healthz and the memory viewer; empty disables.",
    "shutdown_grace_seconds": "How long in-flight RPCs may finish after SIGTERM.",
    "max_receive_message_bytes": "Largest gRPC request accepted, in bytes.",
    "log_level": "Log level: DEBUG, INFO, WARNING or ERROR.",
    "log_format": "Log lines as JSON, as human-readable text, or auto (text on a terminal, JSON otherwise).",
    "metrics_sample_interval_seconds": "How often sessions by status, the session-end backlog and long-term"
    " memory items are counted for /metrics; 0 disables.",
    "viewer_enabled": "Serve the memory viewer (HTML) under /viewer/ on the admin port: loopback browsers"
    " only with auth off, an admin-role token with auth on.",
    "data_dir": "Directory of the embedded Redis, LanceDB and archives when no URI is set.",
    "redis_url": "Redis to use (redis://, rediss://, unix://); empty: an embedded Redis under data_dir.",
    "key_prefix": "Prefix of every Redis key, so several deployments can share one Redis.",
    "default_model": "Model whose tokenizer counts tokens when a request names none.",
    "default_encoding": "tiktoken encoding used when the model is unknown (cl100k_base, o200k_base).",
    "session_ttl_seconds": "Inactivity after which a session expires (channel policies may override).",
    "max_message_bytes": "Largest message content accepted, in bytes.",
    "max_batch_messages": "Most messages accepted in one AppendMessages call.",
    "max_batch_bytes": "Largest AppendMessages batch accepted, in bytes.",
    "strict_env": "Refuse to start when a MEMLANE_* environment variable names no setting (a typo);"
    " off, it is a warning with the closest setting's name.",
    "executor_threads": "Threads for CPU-bound work (token counting, summaries, Parquet).",
    "default_topology": "Who may read a new session's memories when CreateSession names no topology.",
    "auth_required": "Require bearer tokens or mTLS; off serves only loopback and Unix-socket callers.",
    "access_policy_file": "YAML of tokens, agents, roles and groups (reloaded on change).",
    "access_policy_reload_seconds": "How often the access policy file is checked for changes.",
    "tls_cert_file": "PEM certificate: serve TLS on every TCP listen address.",
    "tls_key_file": "PEM private key of tls_cert_file.",
    "tls_client_ca_file": "PEM CA: clients must present a certificate it signed (mTLS).",
    "context_strategy": "How the history section of the context is built.",
    "context_window_turns": "Recent turns kept verbatim by the windowed strategies.",
    "context_reserved_output_tokens": "Tokens of the context window left for the model's answer.",
    "context_system_prompt": "System prompt used when a request sends none.",
    "context_memory_min_similarity": "Relevance floor of assembly: a recalled memory matching no word of the"
    " request and whose cosine to it is below this is left out (0: none); SearchMemories takes min_score.",
    "context_summary_trigger_ratio": "Share of the history budget at which a rolling summary is scheduled.",
    "context_fallback": "What assembly does while the rolling summary is behind.",
    "context_max_traces_per_session": "Turn traces kept per session (oldest dropped first).",
    "summarizer": "Who writes rolling summaries: offline extractive, an OpenAI-compatible LLM or the client.",
    "summarizer_base_url": "Base URL of the OpenAI-compatible summarizer, e.g. https://api.openai.com/v1.",
    "summarizer_model": "Model name of the OpenAI-compatible summarizer.",
    "summarizer_api_key": "API key of the OpenAI-compatible summarizer.",
    "summarizer_timeout_seconds": "Timeout of one summarizer call.",
    "summary_max_tokens": "Largest rolling summary, in tokens.",
    "context_procedures_max_tokens": "Cap in tokens of the approved procedures injected after the system"
    " prompt (within the system section's budget).",
    "procedure_approval": "Whether an agent's proposed procedures become active at once (auto) or only once"
    " an admin approves them (human); agents.<id>.procedure_approval in the access policy overrides it.",
    "ltm_versions_max_per_user": "Versions of a user's memory items kept (every change is one; the oldest"
    " are dropped first).",
    "ltm_snapshots_max_per_user": "Most named snapshots of memory one user may have.",
    "ltm_enabled": "Keep long-term memory (LanceDB, embeddings, MemoryService).",
    "ltm_uri": "LanceDB directory or s3://bucket/prefix; empty: <data_dir>/ltm.",
    "ltm_read_consistency_seconds": (
        "How stale a read of the LTM table may be after another sidecar's write (seconds; 0: check on"
        " every read, negative: never, when no other sidecar shares the table)."
    ),
    "ltm_cross_channel_episodes": "Recall episodes from every channel, not just the session's.",
    "ltm_cache_mb": "LanceDB index cache in MiB (metadata cache: half of it); 0 keeps LanceDB's default.",
    "ltm_hot_index_mb": "MiB of recent readers' memory vectors kept in memory for recall; 0 turns it off.",
    "ltm_recall_expansion": "Recall also searches the turns of the speakers a query names for its topic.",
    "ltm_usage_flush_seconds": "How often recall usage counts are written back.",
    "ltm_max_items_per_agent": "Cap of facts, preferences and instructions per user and agent.",
    "ltm_max_episodes_per_agent": "Cap of episodic memories per user and agent.",
    "ltm_duplicate_similarity": "Cosine similarity at which a new memory merges into an existing one.",
    "ltm_profile_max_items": "Most items in a user's profile section.",
    "ltm_optimize_interval_seconds": "How often the LanceDB table is compacted.",
    "ltm_optimize_after_writes": "Also compact after this many writes; 0: on the timer only.",
    "ltm_prune_interval_seconds": "How often expired and over-cap memories are pruned.",
    "ltm_vector_index_min_rows": "Rows before a vector index is built (below it a filtered scan is exact).",
    "embedding_model_path": "ONNX embedding model; empty: the packaged all-MiniLM-L6-v2 int8.",
    "embedding_tokenizer_path": "tokenizer.json of the embedding model; empty: the vendored one.",
    "embedding_dims": "Dimensions of the embedding model's vectors.",
    "embedding_pooling": "How token vectors become one sentence vector.",
    "embedding_sha256": "Expected SHA-256 of the model file, checked at start.",
    "embedding_threads": "Threads that embed bulk work (session end, learning, large Embed calls) at a"
    " lower CPU priority; query vectors have a thread of their own.",
    "embedding_maths": "int8: the model converted to int8 maths once and cached (a third of the memory,"
    " about twice as fast); as-shipped: the file as it is; auto: int8 for the packaged model.",
    "embedded_redis_fsync": "When the embedded Redis syncs its append-only file: everysec (up to 2 s of"
    " acknowledged writes lost to a kill of Redis alone; a full disk answers STORAGE_FULL) or always"
    " (nothing lost to such a kill; each write waits for its fsync, and Redis exits on a full disk).",
    "embedding_max_call_tokens": "Most tokens the model may read for one call's texts (Embed, CreateMemory,"
    " UpdateMemory, ExtractMemories); a costlier call is refused at once.",
    "embedding_max_inflight_tokens": "Most tokens of callers' embedding work in flight; past it a call waits"
    " briefly, then is refused with a retry hint.",
    "embedding_cache_dir": "Directory of the cached int8 conversion; empty: $XDG_CACHE_HOME/memlane/models"
    " or ~/.cache/memlane/models.",
    "extractor": "Who extracts long-term memories from turns: offline rules or an OpenAI-compatible LLM.",
    "extractor_base_url": "Base URL of the OpenAI-compatible extractor.",
    "extractor_model": "Model name of the OpenAI-compatible extractor.",
    "extractor_api_key": "API key of the OpenAI-compatible extractor.",
    "extractor_timeout_seconds": "Timeout of one extractor call.",
    "channel_policies_file": "YAML or TOML of per-channel timeouts, strategies, retention and promotion.",
    "keyspace_events_configure": "Run CONFIG SET notify-keyspace-events (merging Ex) on Redis at start.",
    "lifecycle_sweep_interval_seconds": "How often deadlines are swept (backs up lost expiry events).",
    "events_max_len": "Lifecycle events kept in the stream WatchSessionEvents reads.",
    "pipeline_enabled": "Run background jobs here: session end (summarize, promote, archive), learning "
    "during the session and LTM upkeep; false for a thin sidecar whose jobs run in `memlane worker` pods.",
    "worker_processes": "Worker processes `memlane serve` starts for the background jobs, so that no "
    "request waits behind their CPU work; 0 runs the jobs in the serving process.",
    "pipeline_concurrency": "Sessions this sidecar runs through the session-end pipeline at once.",
    "pipeline_claim_timeout_seconds": "After this, a dead sidecar's job and session lease are taken over.",
    "pipeline_chunk_messages": "Messages promoted per chunk (progress is saved after each).",
    "pipeline_summary_tokens": "Budget of the summary written at session end.",
    "learn_every_turns": "Promote an open session's new turns to long-term memory after this many"
    " (the exchange awaiting its answer waits); 0: not by count.",
    "learn_idle_seconds": "Promote an open session's remaining turns once it has been quiet this long;"
    " 0: not on idle (with learn_every_turns 0, only session end promotes).",
    "archive_uri": "Parquet archive directory or s3://bucket/prefix; empty: <data_dir>/archive.",
    "archive_retention_interval_seconds": "How often archives past their retention are deleted.",
    "pipeline_max_failures": "Failed deliveries after which a session-end job is parked for an operator"
    " (memlane jobs list-parked | retry-parked).",
    "redis_wait_replicas": "Replicas that must confirm an append or create (Redis WAIT) before it is"
    " acknowledged; 0 answers as soon as the primary has it.",
    "redis_wait_timeout_ms": "How long an append waits for redis_wait_replicas confirmations before"
    " answering UNAVAILABLE.",
    "user_token_required": "Require a signed end-user token (x-memlane-user-token) on every call but an"
    " admin's.",
    "user_token_jwks_file": "JWKS file of the keys that verify end-user tokens (the policy file's"
    " user_token_jwks works too).",
    "user_token_issuer": "When set, an end-user token's iss must equal it.",
    "user_token_audience": "When set, an end-user token's aud must contain it.",
    "admission_limits": "Calls in flight per RPC method (Method=N pairs, comma-separated; * for any"
    " other; 0 ungated); beyond them calls queue briefly, then get RESOURCE_EXHAUSTED with a retry hint.",
    "admission_max_queue": "Calls that may wait for a slot per RPC method before the rest are shed.",
    "admission_max_wait_ms": "How long a queued call waits for a slot before it is shed.",
}
