"""The Redis key layout. Every key is built here and nowhere else.

All keys of one session share the hash tag ``{<session_id>}`` so a session's keys live in one slot and
one Lua script may touch them all on Redis Cluster. Cross-session indexes (per user, deadlines, the
pipeline queue) carry their own tags and are only ever written with separate commands.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


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
class KeySpace:
    """Builds keys under one prefix (``ml`` in production; tests use their own)."""

    prefix: str = "ml"

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

    def session_id_from_alive_key(self, key: str) -> str | None:
        """Inverse of ``session(...).alive``: the session whose activity key just expired."""
        head, tail = f"{self.prefix}:{{", "}:alive"
        if key.startswith(head) and key.endswith(tail):
            return key[len(head) : -len(tail)]
        return None

    def user_sessions(self, user_id: str) -> str:
        """ZSET: session ids of one user, scored by creation time."""
        return f"{self.prefix}:user:{{{user_id}}}:sessions"

    def ltm_version(self, user_id: str) -> str:
        """STRING counter: bumped on every long-term memory write of the user (context/ltm_versions.py).

        Named by a digest of the user id: it must outlive the user's erasure (the erasure bumps it, so
        every sidecar drops what it cached), and an erased user's id must not stay behind in Redis."""
        digest = hashlib.blake2b(user_id.encode(), digest_size=12).hexdigest()
        return f"{self.prefix}:ltmver:{{{digest}}}"

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

    def events(self) -> str:
        """STREAM: lifecycle events (idle, closed, expired, promoted, archived, retired, resumed)."""
        return f"{self.prefix}:events"

    def session_end_queue(self) -> str:
        """STREAM with one consumer group: session-end jobs any sidecar may take."""
        return f"{self.prefix}:queue:session-end"

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
            self.pipeline(session_id),
            self.promoted(session_id),
            self.lease(session_id),
            self.end_marker(session_id),
        )

    def session_indexes(self) -> tuple[str, ...]:
        """Cross-session ZSETs whose members are session ids."""
        return (self.all_sessions(), self.deadlines(), self.idle_due(), self.retire_due())

    def session_streams(self) -> tuple[str, ...]:
        """Streams whose entries name a session in field ``s`` (events, the session-end queue)."""
        return (self.events(), self.session_end_queue())

    def pattern(self) -> str:
        """A SCAN pattern matching every key under this prefix."""
        return f"{self.prefix}:*"
