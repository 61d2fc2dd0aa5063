"""The Redis key layout. Every key is built here and nowhere else.

All keys of one session share the hash tag ``{<session_id>}`` so a session's keys live in one slot and
one Lua script may touch them all on Redis Cluster. Cross-session indexes (per user, deadlines, the
pipeline queue) carry their own tags and are only ever written with separate commands.
"""

from __future__ import annotations

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

    def all_sessions(self) -> str:
        """ZSET: every session id, scored by creation time."""
        return f"{self.prefix}:sessions"

    def deadlines(self) -> str:
        """ZSET: session id scored by inactivity deadline (ms); the sweeper's backstop for lost events."""
        return f"{self.prefix}:deadlines"

    def pattern(self) -> str:
        """A SCAN pattern matching every key under this prefix."""
        return f"{self.prefix}:*"
