"""The history read of one assembly: the turns after the stored summary, and their token counts; and
what it keeps across requests (decoded recent turns, and each turn's wire bytes) so a turn leaves Redis
and is encoded once, not on every assembly that shows it.

Turns are read through ``RecentTurns`` (only those appended since the last request leave Redis),
filtered to what the viewer may read and counted in the request's encoding: the stored count when the
encodings match, else a count remembered per (message, encoding), else one made now (off the loop when
the text is long). What fits is decided by the pure core (``core.Composition.history``).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from concurrent.futures import Executor
from dataclasses import dataclass, field

from ..access.identity import Caller
from ..sessions.model import Message, Session
from ..sessions.store import SessionStore
from ..tokens import TokenCounter, encoding_for_model
from .budget import BudgetPolicy
from .core import SUMMARIZED, GatheredHistory
from .model import Strategy

# Tokenizing more text than this inline would stall the event loop noticeably (about 40 us per 200
# characters); beyond it, counting moves to the executor.
INLINE_COUNT_CHARS = 16_000
# Token counts of messages in an encoding other than their session's, kept across requests.
_RECOUNT_CACHE_SIZE = 100_000


class HistoryReader:
    def __init__(
        self, store: SessionStore, counter: TokenCounter, policy: BudgetPolicy, executor: Executor | None
    ) -> None:
        self._store = store
        self._counter = counter
        self._policy = policy
        self._executor = executor
        self._recent = RecentTurns(store)
        self._recounts: OrderedDict[tuple[str, str, str], int] = OrderedDict()
        # Token counts of turns: a hit is a count known without tokenizing (stored with the message in
        # the session's encoding, or recounted earlier), a miss one tokenized now. Read by metrics.
        self.count_hits = 0
        self.count_misses = 0

    def forget(self, session_ids: set[str]) -> None:
        self._recent.forget(session_ids)
        for key in [k for k in self._recounts if k[0] in session_ids]:
            del self._recounts[key]

    async def count(self, texts: list[str], model: str) -> list[int]:
        if sum(len(t) for t in texts) <= INLINE_COUNT_CHARS:
            return self._counter.count_many(texts, model)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._counter.count_many, texts, model)

    async def read(
        self, session: Session, strategy: Strategy, window_turns: int, viewer: Caller, model: str
    ) -> GatheredHistory:
        """The turns the history section is chosen from, with the content tokens of the readable ones."""
        candidates, unscanned = await self._candidates(session, strategy, window_turns, viewer)
        # Another agent's private turns or a foreign group's never reach this context.
        readable = [
            m for m in candidates if viewer.can_see(m.visibility, m.source_agent_id, m.visibility_group)
        ]
        tokens = await self._content_tokens(session, model, readable)
        return GatheredHistory(candidates, readable, tokens, unscanned)

    async def _candidates(
        self, session: Session, strategy: Strategy, window_turns: int, viewer: Caller
    ) -> tuple[list[Message], int]:
        p = self._policy
        if not session.last_seq:
            return [], 0
        if strategy == Strategy.SLIDING_WINDOW:
            return await self._window(session.session_id, max(1, window_turns), viewer), 0
        after = session.summary.through_seq if strategy in SUMMARIZED else 0
        pending = max(0, session.last_seq - after)
        if pending == 0:
            return [], 0
        msgs = await self._recent.after(session, after, min(pending, p.max_scan_messages))
        return msgs, max(0, pending - p.max_scan_messages)

    async def _window(self, session_id: str, turns: int, viewer: Caller) -> list[Message]:
        """The stored turns holding the viewer's last ``turns`` readable ones: in a distributed session
        the newest turns may all be other agents' private ones, so the read widens (4x a step, up to
        ``max_scan_messages``) until it holds enough or the session has no more."""
        limit = self._policy.max_scan_messages
        n = turns
        while True:
            msgs = await self._store.tail(session_id, n)
            seen = sum(1 for m in msgs if viewer.can_see(m.visibility, m.source_agent_id, m.visibility_group))
            if seen >= turns or len(msgs) < n or n >= limit:
                return msgs
            n = min(limit, n * 4)

    async def _content_tokens(self, session: Session, model: str, msgs: list[Message]) -> list[int]:
        # Stored counts were made in the session's encoding; reuse them when the request's matches.
        # Otherwise count once per (message, encoding) and remember: a model that differs from the
        # session's would else recount the whole history on every request.
        encoding = encoding_for_model(model, self._counter.default_encoding)
        same = encoding == encoding_for_model(session.model, self._counter.default_encoding)
        sid = session.session_id
        counts = [m.token_count if same and (m.token_count or not m.content) else -1 for m in msgs]
        todo: list[int] = []
        for i, n in enumerate(counts):
            if n < 0:
                hit = self._recounts.get((sid, msgs[i].message_id, encoding))
                if hit is None:
                    todo.append(i)
                else:
                    counts[i] = hit
        self.count_hits += len(msgs) - len(todo)
        self.count_misses += len(todo)
        if todo:
            for i, n in zip(todo, await self.count([msgs[i].content for i in todo], model), strict=True):
                counts[i] = n
                self._recounts[(sid, msgs[i].message_id, encoding)] = n
            while len(self._recounts) > _RECOUNT_CACHE_SIZE:
                self._recounts.popitem(last=False)
        return counts


# --- Decoded recent turns per session, kept across requests ----------------------------------------------


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


# --- Per-turn wire bytes (the turn memo) -----------------------------------------------------------------
# Per-turn bytes derived from immutable turns (the wire form of a conversation message), kept across
# requests so a turn is encoded once, not on every assembly that shows it.
#
# Keys are (message id, seq) inside a session: a turn never changes under its id and seq. A session's
# entries stay only while its document shows nothing but appends since they were made (``check``, the same
# rule as ``RecentTurns``): a removal or a retirement drops them; erasure drops them through ``forget``.
# Bounded in bytes, least recently used session first; a miss just costs the encoding.


@dataclass(slots=True)
class _Entry:
    last_seq: int
    message_count: int
    items: dict[tuple[str, int], bytes] = field(default_factory=dict)
    size: int = 0


class TurnMemo:
    def __init__(self, max_bytes: int = 32 << 20) -> None:
        self._max = max_bytes
        self._size = 0
        self._sessions: OrderedDict[str, _Entry] = OrderedDict()

    def check(self, session: Session) -> None:
        """Called with each freshly read session document: keeps its entries only if it saw appends alone."""
        sid = session.session_id
        entry = self._sessions.get(sid)
        if entry is not None:
            grown = session.last_seq - entry.last_seq
            if grown < 0 or session.message_count - entry.message_count != grown:
                self._drop(sid)
                entry = None
        if entry is None:
            entry = self._sessions[sid] = _Entry(session.last_seq, session.message_count)
        entry.last_seq, entry.message_count = session.last_seq, session.message_count
        self._sessions.move_to_end(sid)

    def get(self, session_id: str, message_id: str, seq: int) -> bytes | None:
        entry = self._sessions.get(session_id)
        return entry.items.get((message_id, seq)) if entry is not None else None

    def put(self, session_id: str, message_id: str, seq: int, data: bytes) -> None:
        """Only for a session ``check`` has seen (an entry dropped meanwhile is not brought back)."""
        entry = self._sessions.get(session_id)
        if entry is None or (message_id, seq) in entry.items:
            return
        entry.items[(message_id, seq)] = data
        entry.size += len(data)
        self._size += len(data)
        while self._size > self._max and self._sessions:
            self._drop(next(iter(self._sessions)))

    def forget(self, session_ids: set[str]) -> None:
        for sid in session_ids:
            self._drop(sid)

    def _drop(self, session_id: str) -> None:
        entry = self._sessions.pop(session_id, None)
        if entry is not None:
            self._size -= entry.size
