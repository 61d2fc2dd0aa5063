"""Long-term memory as assembly's ``MemorySource``: the adapter the app wires in."""

from __future__ import annotations

import time
from collections import OrderedDict

from ..access.identity import Caller
from ..ltm import MemoryFilter, MemoryService, RecallQuery, Visibility
from .sources import MemoryHit

# The profile changes when a session ends (promotion) or an item is edited, not between two turns;
# caching it per viewer takes a LanceDB scan off every assembly. Writes invalidate it through the
# user's LTM version; the TTL only bounds what no write announces (an item reaching its valid_until).
PROFILE_TTL_S = 5.0
_PROFILE_CACHE_SIZE = 4096


def _who(user_id: str, viewer: Caller) -> Visibility:
    """The LTM view of a caller: its own and its groups' items, always inside one user."""
    return Visibility(user_id, viewer.agent_id, sorted(viewer.groups))


class LtmMemorySource:
    """What it returns gets injected, so each returned item counts one use (batched, off the hot path).

    ``cross_channel_episodes`` False keeps raw conversation (episodic items) inside the channel it was
    said in, while facts and preferences follow the user across channels. A write in any process (a
    worker, another sidecar) takes effect on the next assembly here (``ltm/core.py``).
    """

    def __init__(
        self,
        memory: MemoryService,
        *,
        cross_channel_episodes: bool = False,
    ) -> None:
        self._memory = memory
        self._cross_channel = cross_channel_episodes
        self._profiles: OrderedDict[tuple[object, ...], tuple[float, bytes, list[MemoryHit]]] = OrderedDict()
        self.profile_hits = 0  # profile cache lookups, read by metrics
        self.profile_misses = 0

    @property
    def service(self) -> MemoryService:
        return self._memory

    async def _version(self, user_id: str) -> bytes:
        """The user's current LTM version; on a change, this process's view of the store is refreshed
        (``ltm/core.py``) before anything is read, and cached profiles of another version miss."""
        return await self._memory.freshness.current(user_id)

    async def profile(self, user_id: str, viewer: Caller, limit_tokens: int) -> list[MemoryHit]:
        version = await self._version(user_id)
        key = (user_id, viewer.agent_id, viewer.groups, limit_tokens)
        cached = self._profiles.get(key)
        if cached is not None and cached[0] > time.monotonic() and cached[1] == version:
            hits = cached[2]
            self.profile_hits += 1
        else:
            self.profile_misses += 1
            # About four characters a token for English prose; assembly caps the section again.
            profile = await self._memory.profile(_who(user_id, viewer), max_chars=max(1, limit_tokens * 4))
            hits = [MemoryHit(i.id, i.content, i.importance) for i in profile.items()]
            self._profiles[key] = (time.monotonic() + PROFILE_TTL_S, version, hits)
            self._profiles.move_to_end(key)
            while len(self._profiles) > _PROFILE_CACHE_SIZE:
                self._profiles.popitem(last=False)
        await self._memory.bump_usage([h.memory_id for h in hits])
        return hits

    def forget(self, user_id: str) -> None:
        for key in [k for k in self._profiles if k[0] == user_id]:
            del self._profiles[key]
        self._memory.drop_cached(user_id)  # and the recall index of the user's items

    async def recall(
        self, user_id: str, viewer: Caller, query: str, limit: int, channel: str = "", *, spares: int = 0
    ) -> list[MemoryHit]:
        if not query.strip():
            return []
        # The version read refreshes this sidecar's view when another wrote; a caller who can see
        # nothing gets [] from the recall index without the query being embedded.
        await self._version(user_id)
        flt = MemoryFilter(episodes_from_channel=None if self._cross_channel else channel)
        query_ = RecallQuery(_who(user_id, viewer), query[-2000:], limit + spares, filter=flt)
        hits = await self._memory.search(query_)
        # A use each for the first ``limit``: the spares are injected only in place of a repeat.
        await self._memory.bump_usage([h.item.id for h in hits[:limit]])
        return [MemoryHit(h.item.id, h.item.content, h.score, h.parts) for h in hits]
