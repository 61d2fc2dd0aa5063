"""A reader's view kept current with writes made elsewhere: by a worker process of this sidecar (session
end, learning), or by another sidecar on the same table.

Every LTM write bumps the user's version token in Redis (``sessions/ltm_versions.py``), and a write that
removed rows its removals token too. Before a read of a user's memories, both are read (once per user in
flight: a profile and a recall of one assembly share them) and compared with the ones this process's
view was last current with. On a change the table's view is refreshed, and the user's in-memory recall
entry is brought up to date with the rows changed since it was loaded (``catch_up``: a learn job's new
episodes cost their own rows, not a reload of the user's ten thousand), or dropped when rows were
removed (a reload is then the only way to see what is gone). Either way the read sees the write. A
token seen is trusted for an hour at most (a lost bump cannot keep a view stale for longer).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol

SEEN_TTL_S = 3600.0
_SEEN_SIZE = 4096


class Versions(Protocol):
    async def read(self, user_id: str) -> tuple[bytes, bytes]: ...


class Freshness:
    def __init__(
        self,
        versions: Versions | None,
        *,
        refresh: Callable[[], Awaitable[None]],
        drop: Callable[[str], None],
        catch_up: Callable[[str], Awaitable[None]],
    ) -> None:
        """``refresh``: bring the table's view to its latest version; ``drop``: forget what this process
        holds of one user (the in-memory recall entry); ``catch_up``: bring it up to date with the rows
        changed since it was loaded."""
        self._versions = versions
        self._refresh = refresh
        self._drop = drop
        self._catch_up = catch_up
        # user -> (version, removals this process's view is current with, until when that is trusted)
        self._seen: OrderedDict[str, tuple[bytes, bytes, float]] = OrderedDict()
        self._reads: dict[str, asyncio.Future[tuple[bytes, bytes]]] = {}

    async def current(self, user_id: str) -> bytes:
        """The user's version, this process's view made current with it first ("" without tokens)."""
        if self._versions is None:
            return b""
        read = self._reads.get(user_id)
        if read is None:
            read = self._reads[user_id] = asyncio.ensure_future(self._versions.read(user_id))
            read.add_done_callback(lambda _f: self._reads.pop(user_id, None))
        version, removals = await asyncio.shield(read)
        seen = self._seen.get(user_id)
        now = time.monotonic()
        if seen is None or seen[0] != version or seen[2] <= now:
            await self._refresh()
            if seen is not None and seen[1] == removals and seen[2] > now:
                await self._catch_up(user_id)  # rows added or changed only
            else:
                self._drop(user_id)
            self._seen[user_id] = (version, removals, now + SEEN_TTL_S)
            self._seen.move_to_end(user_id)
            while len(self._seen) > _SEEN_SIZE:
                self._seen.popitem(last=False)
        return version

    def forget(self, user_id: str) -> None:
        """Erasure: the user id itself is the user's data."""
        self._seen.pop(user_id, None)
