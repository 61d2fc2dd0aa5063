"""Which users memlane holds data about (ListUsers): those with a session index in Redis and those with
long-term memory items, joined, counted, ordered by id and paged.

There is no user table to keep in step with every write path: the directory is read from where the
data is, so a user appears the moment anything is stored for them and is gone once erased. A listing
scans the session indexes' key names and the memory table's user column, which is what an operator's
page needs at the scale of one sidecar's users; the page itself is bounded like any other.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..errors import InvalidArgument
from ..ltm import MemoryService
from ..paging import cursor_of, decode_token, encode_token, page_size, query_fingerprint
from ..sessions.store import SessionStore

MAX_QUERY_CHARS = 128  # a user id is at most 128 characters: a longer text matches none
MAX_PAGE = 500


@dataclass(frozen=True, slots=True)
class UserSummary:
    user_id: str
    session_count: int
    memory_count: int
    last_session_at_ms: int


@dataclass(frozen=True, slots=True)
class UserPage:
    users: list[UserSummary]
    next_page_token: str
    total: int


class UserDirectory:
    def __init__(self, sessions: SessionStore, memory: MemoryService | None) -> None:
        self._sessions = sessions
        self._memory = memory

    async def _memory_counts(self) -> Counter[str]:
        if self._memory is None:
            return Counter()
        table = await self._memory.store.fetch_columns(None, ["user_id"])
        return Counter(str(u) for u in table.column("user_id").to_pylist())

    async def list(self, query: str, size: int, token: str, *, only: str = "") -> UserPage:
        """Users whose id contains ``query`` (case-insensitive), ordered by id; ``only``: a call bound to
        one end user sees that user alone."""
        if len(query) > MAX_QUERY_CHARS:
            raise InvalidArgument(f"query is longer than {MAX_QUERY_CHARS} characters")
        size = page_size(size, maximum=MAX_PAGE)
        fingerprint = query_fingerprint("users", query, only)
        cursor = decode_token(token, fingerprint)
        after = str(cursor_of(cursor, str)[0]) if cursor is not None else None
        memories = await self._memory_counts()
        ids = (await self._sessions.users_with_sessions()) | set(memories)
        needle = query.casefold()
        matching = sorted(u for u in ids if needle in u.casefold() and (not only or u == only))
        start = 0 if after is None else next((i for i, u in enumerate(matching) if u > after), len(matching))
        page = matching[start : start + size]
        counts = await self._sessions.session_counts(page)
        users = [
            UserSummary(u, n, memories.get(u, 0), last) for u, (n, last) in zip(page, counts, strict=True)
        ]
        more = start + size < len(matching)
        return UserPage(users, encode_token(fingerprint, [page[-1]]) if more and page else "", len(matching))
