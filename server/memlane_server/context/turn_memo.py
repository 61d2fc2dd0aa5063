"""Per-turn bytes derived from immutable turns (the wire form of a conversation message), kept across
requests so a turn is encoded once, not on every assembly that shows it.

Keys are (message id, seq) inside a session: a turn never changes under its id and seq. A session's
entries stay only while its document shows nothing but appends since they were made (``check``, the same
rule as ``RecentTurns``): a removal or a retirement drops them; erasure drops them through ``forget``.
Bounded in bytes, least recently used session first; a miss just costs the encoding.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from ..sessions.model import Session


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
