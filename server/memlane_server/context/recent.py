"""Decoded recent turns per session, kept across requests (the history read of assembly)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from ..sessions.model import Message, Session
from ..sessions.store import SessionStore


@dataclass(slots=True)
class _Cached:
    after: int  # the list holds every stored message with seq > after, up to last_seq
    last_seq: int
    message_count: int
    messages: list[Message]


class RecentTurns:
    """Decoded recent turns per session, so a request reads only the turns appended since the last one.

    Reading and decoding 200 messages costs about 2 ms, several gRPC round trips. Turns are append-only
    (an id is never rewritten), so a cached list stays valid while the session document shows only
    appends since: ``last_seq`` and ``message_count`` grew by the same amount. Anything else (a retired
    message, another writer's surprise) refetches. Bounded LRU; a miss just costs the full read.
    """

    def __init__(self, store: SessionStore, max_sessions: int = 256) -> None:
        self._store = store
        self._max = max_sessions
        self._entries: OrderedDict[str, _Cached] = OrderedDict()

    def forget(self, session_ids: set[str]) -> None:
        for sid in session_ids:
            self._entries.pop(sid, None)

    async def after(self, session: Session, after: int, limit: int) -> list[Message]:
        """The newest ``limit`` stored messages with seq > ``after``, oldest first."""
        sid = session.session_id
        entry = self._entries.get(sid)
        grown = session.last_seq - entry.last_seq if entry else -1
        if (
            entry is not None
            and entry.after <= after
            and grown >= 0
            and session.message_count - entry.message_count == grown
        ):
            new = (
                await self._store.range_by_seq(sid, entry.last_seq, session.last_seq, grown) if grown else []
            )
            msgs = [m for m in entry.messages if m.seq > after] + new
        else:
            msgs = await self._store.tail(sid, limit)
            msgs = [m for m in msgs if m.seq > after]
            # Complete above `after` only if the tail did not stop short of it.
            if len(msgs) >= limit:
                after = msgs[0].seq - 1
        msgs = msgs[-limit:] if len(msgs) > limit else msgs
        start = msgs[0].seq - 1 if len(msgs) >= limit else after
        self._entries[sid] = _Cached(start, session.last_seq, session.message_count, msgs)
        self._entries.move_to_end(sid)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)
        return msgs
