"""The Redis key layout. Every key is built here and nowhere else: a leaf every store reaches (sessions,
checkpoints, procedures, long-term memory's versions) without importing another store.

All keys of one session share the hash tag ``{<session_id>}`` so a session's keys live in one slot and
one Lua script may touch them all on Redis Cluster. Cross-session indexes (per user, deadlines, the
pipeline queue) carry their own tags and are only ever written with separate commands.

Also here, because it needs nothing but the layout: ``drop_keys``, the clean-up for commands that run a
sidecar on a user's Redis for a while (``memlane eval``, ``memlane bench``): every key they created lives
under their own key prefix, and goes when they finish.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """The keys of one session."""

    doc: str  # HASH: the session document
    messages: str  # HASH: message_id -> fingerprint + serialized message
    order: str  # ZSET: message_id scored by seq (arrival order)
    alive: str  # STRING with the inactivity TTL; its expiry event means "session went quiet"
    traces: str  # ZSET: trace_id scored by creation time
    trace_data: str  # HASH: trace_id -> serialized turn trace

    def all(self) -> tuple[str, ...]:
        return (self.doc, self.messages, self.order, self.alive, self.traces, self.trace_data)


@dataclass(frozen=True, slots=True)
class CheckpointKeys:
    """Framework state of one session (checkpoints/store.py). Members and fields are
    ``<namespace>\\0<checkpoint_id>`` (writes: ``...\\0<task_id>\\0<index>``), so a lexical range is one
    namespace, or one checkpoint's writes."""

    index: str  # ZSET, all scores 0: checkpoint members, ordered lexically (ids sort by time)
    data: str  # HASH: member -> parent, time, type, metadata JSON, checkpoint bytes
    versions: str  # HASH: member -> channel\0version\0... (which blobs the checkpoint reads)
    blobs: str  # HASH: namespace\0channel\0version -> type\0bytes
    runs: str  # HASH: member -> run id (for DeleteCheckpointRuns)
    write_index: str  # ZSET, all scores 0: write members
    writes: str  # HASH: write member -> task, index, channel, path, type, bytes

    def all(self) -> tuple[str, ...]:
        return (self.index, self.data, self.versions, self.blobs, self.runs, self.write_index, self.writes)


@dataclass(frozen=True, slots=True)
class KeySpace:
    """Builds keys under one prefix (``ml`` in production; tests use their own)."""

    prefix: str  # the key_prefix setting, which holds the default

    def session(self, session_id: str) -> SessionKeys:
        base = f"{self.prefix}:{{{session_id}}}"
        return SessionKeys(
            doc=f"{base}:doc",
            messages=f"{base}:msgs",
            order=f"{base}:order",
            alive=f"{base}:alive",
            traces=f"{base}:traces",
            trace_data=f"{base}:tracedata",
        )

    def checkpoints(self, session_id: str) -> CheckpointKeys:
        base = f"{self.prefix}:{{{session_id}}}:ck"
        return CheckpointKeys(
            index=f"{base}:idx",
            data=f"{base}:data",
            versions=f"{base}:vers",
            blobs=f"{base}:blobs",
            runs=f"{base}:runs",
            write_index=f"{base}:widx",
            writes=f"{base}:w",
        )

    def checkpoint_run(self, run_id: str) -> str:
        """SET: the sessions holding checkpoints of one run (its own hash tag; written separately)."""
        return f"{self.prefix}:ckrun:{{{run_id}}}"

    def removals(self, session_id: str) -> str:
        """HASH: request id -> answer of a RemoveMessages call, so a retry removes nothing more."""
        return f"{self.prefix}:{{{session_id}}}:removals"

    def session_id_from_alive_key(self, key: str) -> str | None:
        """Inverse of ``session(...).alive``: the session whose activity key just expired."""
        head, tail = f"{self.prefix}:{{", "}:alive"
        if key.startswith(head) and key.endswith(tail):
            return key[len(head) : -len(tail)]
        return None

    def session_pattern(self, session_id: str) -> str:
        """A SCAN pattern matching every key in the session's hash tag (a check that none is left; erasure
        deletes ``every_key_of``), with the id's glob characters escaped."""
        return f"{self.prefix}:{{{_glob_escaped(session_id)}}}:*"

    def user_sessions(self, user_id: str) -> str:
        """ZSET: session ids of one user, scored by creation time."""
        return f"{self.prefix}:user:{{{user_id}}}:sessions"

    def all_user_sessions(self) -> str:
        """A SCAN pattern matching every user's sessions index (ListUsers reads users from it)."""
        return f"{self.prefix}:user:{{*}}:sessions"

    def user_id_from_sessions_key(self, key: str) -> str | None:
        head, tail = f"{self.prefix}:user:{{", "}:sessions"
        if key.startswith(head) and key.endswith(tail):
            return key[len(head) : -len(tail)]
        return None

    def user_pattern(self, user_id: str) -> str:
        """A SCAN pattern matching every per-user key (sessions index, LTM version, once-marks), with the
        id's glob characters escaped: a user id is the caller's string, never a pattern."""
        return f"{self.prefix}:user:{{{_glob_escaped(user_id)}}}:*"

    def erasures(self) -> str:
        """HASH: user id -> when its erasure started (ms); a field outlives its erasure only if the
        sidecar running it died (``sessions/leases.py ErasureJournal``)."""
        return f"{self.prefix}:erasures"

    def erasing(self, user_id: str) -> str:
        """STRING with a TTL: the sidecar running this user's erasure now. Outside the user's key pattern,
        which the erasure itself deletes."""
        return f"{self.prefix}:erasing:{{{user_id}}}"

    def ltm_version(self, user_id: str) -> str:
        """STRING token: replaced on every long-term memory write of the user (ltm/redis_state.py)."""
        return f"{self.prefix}:user:{{{user_id}}}:ltmver"

    def ltm_learnt(self, user_id: str) -> str:
        """STRING token: replaced on every write learning made (a worker's promotion: ltm/redis_state.py)."""
        return f"{self.prefix}:user:{{{user_id}}}:ltmlearnt"

    def ltm_removals(self, user_id: str) -> str:
        """STRING token: replaced on every write that removed rows of the user (ltm/redis_state.py)."""
        return f"{self.prefix}:user:{{{user_id}}}:ltmrm"

    def import_parts(self, user_id: str, upload_id: str) -> str:
        """HASH with a TTL: part number -> the parts of an import file sent in parts, held until its
        last part (sessions/import_parts.py). A per-user key: erasing the user erases them."""
        return f"{self.prefix}:user:{{{user_id}}}:import:{upload_id}"

    # --- long-term memory versions and snapshots (ltm/redis_state.py); per-user keys, so
    # erasure's scan of ``user_pattern`` removes them with the rest of the user

    def memory_versions(self, user_id: str) -> str:
        """STREAM: every change to one user's memory items (who, when, why, the item after it)."""
        return f"{self.prefix}:user:{{{user_id}}}:memver"

    def memory_snapshots(self, user_id: str) -> str:
        """ZSET: snapshot ids of one user, scored by creation time."""
        return f"{self.prefix}:user:{{{user_id}}}:snaps"

    def memory_snapshot(self, user_id: str, snapshot_id: str) -> str:
        """HASH: memory id -> the item as the snapshot holds it; field ``\0meta`` -> the snapshot's own
        description. The snapshot id sits outside the hash tag: ids hold no ``{}`` (ids.py)."""
        return f"{self.prefix}:user:{{{user_id}}}:snap:{snapshot_id}"

    # --- procedural memory (procedures/store.py)

    def procedures(self, owner_tag: str) -> tuple[str, str]:
        """(HASH procedure id -> document with every version, HASH procedure id -> its active version)
        of one owner (``a:<agent>`` or ``g:<group>``), both in the owner's slot."""
        base = f"{self.prefix}:proc:{{{owner_tag}}}"
        return f"{base}:docs", f"{base}:active"

    def procedure_owners(self) -> str:
        """SET: every owner tag holding procedures (listing across owners)."""
        return f"{self.prefix}:proc:owners"

    def procedure_sources(self, user_id: str) -> str:
        """SET: ``<owner tag>\0<procedure id>\0<version>`` of procedure versions learned from the
        user's sessions (erasure and export find them here)."""
        return f"{self.prefix}:user:{{{user_id}}}:procsrc"

    def ltm_lock(self) -> str:
        """STRING with a TTL: the sidecar compacting, indexing or erasing the shared LTM table now."""
        return f"{self.prefix}:ltm:lock"

    def all_sessions(self) -> str:
        """ZSET: every session id, scored by creation time."""
        return f"{self.prefix}:sessions"

    def deadlines(self) -> str:
        """ZSET: session id scored by inactivity deadline (ms); the sweeper's backstop for lost events."""
        return f"{self.prefix}:deadlines"

    # --- lifecycle and the session-end pipeline (sessions/lifecycle.py, pipelines/)

    def pipeline(self, session_id: str) -> str:
        """HASH: per-step progress of the session-end pipeline (through-seqs, archive pointers)."""
        return f"{self.prefix}:{{{session_id}}}:pipeline"

    def promoted(self, session_id: str) -> str:
        """SET: ids of the long-term memories promoted from this session."""
        return f"{self.prefix}:{{{session_id}}}:promoted"

    def lease(self, session_id: str) -> str:
        """STRING with a TTL: who runs this session's pipeline (or resumes / retires it) right now."""
        return f"{self.prefix}:{{{session_id}}}:lease"

    def end_marker(self, session_id: str) -> str:
        """STRING with a short TTL: an expiry job is queued; stops N listening sidecars queueing N jobs."""
        return f"{self.prefix}:{{{session_id}}}:endq"

    def facts_marker(self, session_id: str) -> str:
        """STRING with a TTL: a facts job for this session is queued and not started yet (coalescing: at
        most one waits per session however many user turns arrive meanwhile)."""
        return f"{self.prefix}:{{{session_id}}}:factsq"

    def once(self, scope: str, user_id: str, op_id: str) -> str:
        """Marks a client-chosen operation id as done (retry de-duplication); ids are validated."""
        return f"{self.once_prefix(user_id)}{scope}:{op_id}"

    def once_prefix(self, user_id: str) -> str:
        """What every once-mark of the user starts with (erasure counts them)."""
        return f"{self.prefix}:user:{{{user_id}}}:once:"

    def events(self) -> str:
        """STREAM: lifecycle events (idle, closed, expired, promoted, archived, retired, resumed)."""
        return f"{self.prefix}:events"

    def outbox(self, session_id: str) -> str:
        """LIST: events written with the state changes, not yet on the stream (sessions/events.py)."""
        return f"{self.prefix}:{{{session_id}}}:outbox"

    def outbox_due(self) -> str:
        """ZSET: session id scored by when the sweeper relays its outbox (a crashed writer's events)."""
        return f"{self.prefix}:outbox-due"

    def relayed_events(self) -> str:
        """ZSET: ids of events already on the stream, scored by relay time (exactly-once relay).

        Tagged with the stream's own name, so it shares the stream's slot on Redis Cluster."""
        return f"{self.prefix}:{{{self.events()}}}:relayed"

    def session_end_outbox(self) -> str:
        """LIST: events of the session-end queue (PARKED) not yet on the stream; the queue's slot, so
        parking a job writes its event in the same MULTI."""
        return f"{self.prefix}:{{{self.session_end_queue()}}}:outbox"

    def session_end_queue(self) -> str:
        """STREAM with one consumer group: session-end and learn jobs any worker may take."""
        return f"{self.prefix}:queue:session-end"

    def summary_queue(self) -> str:
        """STREAM with one consumer group: background summaries of open sessions, a lane of their own."""
        return f"{self.prefix}:queue:summaries"

    def facts_queue(self) -> str:
        """STREAM with one consumer group: facts jobs (a user turn's facts and preferences, learnt at
        once), a lane of their own so they never wait behind promotions."""
        return f"{self.prefix}:queue:facts"

    def session_end_parked(self) -> str:
        """STREAM: session-end jobs that failed too often, kept for an operator to inspect and retry.

        Tagged with the queue's own name, so it shares the queue's slot on Redis Cluster: parking and
        unparking move a job between the two in one MULTI."""
        return f"{self.prefix}:{{{self.session_end_queue()}}}:parked"

    def session_end_failures(self) -> str:
        """HASH: failed runs per queued job id (the queue's slot, like ``session_end_parked``)."""
        return f"{self.prefix}:{{{self.session_end_queue()}}}:failures"

    def idle_due(self) -> str:
        """ZSET: session id scored by when to check it for idleness next (ms)."""
        return f"{self.prefix}:idle-due"

    def retire_due(self) -> str:
        """ZSET: archived session id scored by when its hot data leaves Redis (ms)."""
        return f"{self.prefix}:retire-due"

    def job_lock(self, name: str) -> str:
        """STRING with a TTL: one sidecar at a time runs the named periodic job (e.g. archive retention)."""
        return f"{self.prefix}:lock:{name}"

    def every_key_of(self, session_id: str) -> tuple[str, ...]:
        """Every per-session key, for erasure: the document, messages, traces and pipeline state."""
        return (
            *self.session(session_id).all(),
            *self.checkpoints(session_id).all(),
            self.removals(session_id),
            self.pipeline(session_id),
            self.promoted(session_id),
            self.lease(session_id),
            self.end_marker(session_id),
            self.facts_marker(session_id),
            self.outbox(session_id),
        )

    def session_indexes(self) -> tuple[str, ...]:
        """Cross-session ZSETs whose members are session ids."""
        return (
            self.all_sessions(),
            self.deadlines(),
            self.idle_due(),
            self.retire_due(),
            self.outbox_due(),
        )

    def session_streams(self) -> tuple[str, ...]:
        """Streams whose entries name a session in field ``s`` (events, the session-end queue)."""
        return (self.events(), self.session_end_queue(), self.session_end_parked())

    def pattern(self) -> str:
        """A SCAN pattern matching every key under this prefix."""
        return f"{self.prefix}:*"


def _glob_escaped(value: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\^-" else ch for ch in value)


# ----------------------------------------------------------------- scratch prefixes (eval, bench)


def drop_keys(redis_url: str, key_prefix: str, *, batch: int = 500) -> int:
    """Deletes every key under ``key_prefix`` (the layout of ``KeySpace``); returns how many. SCAN, not
    KEYS, so a big shared Redis is not blocked."""
    client = redis.Redis.from_url(redis_url)
    deleted = 0
    try:
        pending: list[bytes] = []
        for key in client.scan_iter(match=KeySpace(key_prefix).pattern(), count=1000):
            pending.append(key)
            if len(pending) >= batch:
                deleted += int(client.unlink(*pending))
                pending.clear()
        if pending:
            deleted += int(client.unlink(*pending))
    finally:
        client.close()
    return deleted
