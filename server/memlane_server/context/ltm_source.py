"""Long-term memory as assembly's ``MemorySource``: the adapter the app wires in."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

from ..access.identity import Caller
from ..ltm import MemoryFilter, MemoryService, RecallQuery, Visibility
from ..sessions.ltm_versions import LtmVersions
from .sources import MemoryHit

# The profile changes when a session ends (promotion) or an item is edited, not between two turns;
# caching it per viewer takes a LanceDB scan off every assembly. Writes invalidate it through the
# user's LTM version; the TTL only bounds what no write announces (an item reaching its valid_until).
PROFILE_TTL_S = 5.0
_PROFILE_CACHE_SIZE = 4096
_SEEN_SIZE = 4096


def _who(user_id: str, viewer: Caller) -> Visibility:
    """The LTM view of a caller: its own and its groups' items, always inside one user."""
    return Visibility(user_id, viewer.agent_id, sorted(viewer.groups))


class LtmMemorySource:
    """What it returns gets injected, so each returned item counts one use (batched, off the hot path).

    ``cross_channel_episodes`` False keeps raw conversation (episodic items) inside the channel it was
    said in, while facts and preferences follow the user across channels. With ``versions`` (the app
    always passes them) a write on any sidecar takes effect on the next assembly here.
    """

    # How long a remembered version counts as known (then the view is refreshed anyway).
    SEEN_TTL_S = 3600.0

    def __init__(
        self,
        memory: MemoryService,
        *,
        cross_channel_episodes: bool = False,
        versions: LtmVersions | None = None,
    ) -> None:
        self._memory = memory
        self._cross_channel = cross_channel_episodes
        self._versions = versions
        self._profiles: OrderedDict[tuple[object, ...], tuple[float, bytes, list[MemoryHit]]] = OrderedDict()
        # user -> (version this sidecar's view is current with, until when that is trusted)
        self._seen: OrderedDict[str, tuple[bytes, float]] = OrderedDict()
        # One version read per user in flight: profile and recall of one assembly share it.
        self._reads: dict[str, asyncio.Future[bytes]] = {}
        self.profile_hits = 0  # profile cache lookups, read by metrics
        self.profile_misses = 0

    @property
    def service(self) -> MemoryService:
        return self._memory

    async def _version(self, user_id: str) -> bytes:
        """The user's current LTM version; on a change, this sidecar's view of the store is refreshed
        and its cached profiles of the user dropped before anything is read."""
        if self._versions is None:
            return b""
        read = self._reads.get(user_id)
        if read is None:
            read = self._reads[user_id] = asyncio.ensure_future(self._versions.read(user_id))
            read.add_done_callback(lambda _f: self._reads.pop(user_id, None))
        version = await asyncio.shield(read)
        seen = self._seen.get(user_id)
        now = time.monotonic()
        if seen is None or seen[0] != version or seen[1] <= now:
            await self._memory.store.refresh()
            self.forget(user_id)
            self._seen[user_id] = (version, now + self.SEEN_TTL_S)
            self._seen.move_to_end(user_id)
            while len(self._seen) > _SEEN_SIZE:
                self._seen.popitem(last=False)
        return version

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
        self._seen.pop(user_id, None)  # the user id itself is the user's data
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
