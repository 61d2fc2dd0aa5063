"""Long-term memory as assembly's ``MemorySource``: the adapter the app wires in."""

from __future__ import annotations

import time
from collections import OrderedDict

from memlane_server.access.identity import Caller
from memlane_server.ltm import MemoryFilter, MemoryService, RecallQuery, Visibility

from .sources import MemoryHit

# The profile changes when a session ends (promotion) or an item is edited, not between two turns;
# caching it per viewer for a few seconds takes a LanceDB scan off every assembly.
PROFILE_TTL_S = 5.0
_PROFILE_CACHE_SIZE = 4096


def _who(user_id: str, viewer: Caller) -> Visibility:
    """The LTM view of a caller: its own and its groups' items, always inside one user."""
    return Visibility(user_id, viewer.agent_id, sorted(viewer.groups))


class LtmMemorySource:
    """What it returns gets injected, so each returned item counts one use (batched, off the hot path).

    ``cross_channel_episodes`` False keeps raw conversation (episodic items) inside the channel it was
    said in, while facts and preferences follow the user across channels.
    """

    def __init__(self, memory: MemoryService, *, cross_channel_episodes: bool = False) -> None:
        self._memory = memory
        self._cross_channel = cross_channel_episodes
        self._profiles: OrderedDict[tuple[object, ...], tuple[float, list[MemoryHit]]] = OrderedDict()

    async def profile(self, user_id: str, viewer: Caller, limit_tokens: int) -> list[MemoryHit]:
        key = (user_id, viewer.agent_id, viewer.groups, limit_tokens)
        cached = self._profiles.get(key)
        if cached is not None and cached[0] > time.monotonic():
            hits = cached[1]
        else:
            # About four characters a token for English prose; assembly caps the section again.
            profile = await self._memory.profile(_who(user_id, viewer), max_chars=max(1, limit_tokens * 4))
            hits = [MemoryHit(i.id, i.content, i.importance) for i in profile.items()]
            self._profiles[key] = (time.monotonic() + PROFILE_TTL_S, hits)
            self._profiles.move_to_end(key)
            while len(self._profiles) > _PROFILE_CACHE_SIZE:
                self._profiles.popitem(last=False)
        await self._memory.bump_usage([h.memory_id for h in hits])
        return hits

    def forget(self, user_id: str) -> None:
        for key in [k for k in self._profiles if k[0] == user_id]:
            del self._profiles[key]

    async def recall(
        self, user_id: str, viewer: Caller, query: str, limit: int, channel: str = ""
    ) -> list[MemoryHit]:
        if not query.strip():
            return []
        flt = MemoryFilter(episodes_from_channel=None if self._cross_channel else channel)
        hits = await self._memory.search(RecallQuery(_who(user_id, viewer), query[-2000:], limit, filter=flt))
        await self._memory.bump_usage([h.item.id for h in hits])
        return [MemoryHit(h.item.id, h.item.content, h.score) for h in hits]
