"""What assembly gathers from the other memories, each as a protocol the app wires an adapter into:
long-term memory (``MemorySource``; ``LtmMemorySource`` is the adapter over ``ltm.MemoryService``) and
procedural memory (``ProcedureSource``; the app wires ``procedures.ProcedureService`` in).

Only active (approved) procedure versions ever reach assembly, of the viewer's own agent and of its
groups: the source is asked for exactly those owners, so another agent's procedure cannot reach this
context. (The procedures block itself is built in ``compose``, like every block.)
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..access.identity import Caller
from ..ltm import MemoryFilter, MemoryService, RecallQuery, Visibility
from ..ltm.model import ScoreParts
from ..ltm.recall import STALE_KEY
from ..observability import spans
from ..procedures.store import ActiveProcedure


@dataclass(frozen=True, slots=True)
class MemoryHit:
    memory_id: str
    text: str
    score: float = 0.0
    parts: ScoreParts | None = None  # why a recalled memory ranked where it did; None for profile items
    # An episode that carries a fact since superseded (ltm's ``STALE_KEY``): what was said then, no
    # longer true. Search ranks it lower; a context leaves it out (the newer value is what holds).
    stale: bool = False


class MemorySource(Protocol):
    """Profile facts and recalled memories of one user, as ``viewer`` may see them (its own and its
    groups' items, never another agent's private ones). Both may be slow (retrieval)."""

    async def profile(self, user_id: str, viewer: Caller, limit_tokens: int) -> list[MemoryHit]:
        """The user's semantic profile, most important first, roughly within ``limit_tokens``."""
        ...

    async def recall(
        self,
        user_id: str,
        viewer: Caller,
        query: str,
        limit: int,
        channel: str = "",
        *,
        spares: int = 0,
        session_id: str = "",
    ) -> list[MemoryHit]:
        """Memories relevant to ``query``, best first; ``channel`` is where the conversation happens,
        ``session_id`` the session asking: its own turns are not recalled to it as episodes (its
        history, by its strategy, decides which of them it sees). Up to ``limit + spares``: the spares
        stand in for hits assembly already shows elsewhere."""
        ...

    def forget(self, user_id: str) -> None:
        """Drop anything cached about the user (erasure)."""
        ...


class NoMemory:
    """A ``MemorySource`` with nothing in it: assembly without long-term memory."""

    def forget(self, user_id: str) -> None:
        return None

    async def profile(self, user_id: str, viewer: Caller, limit_tokens: int) -> list[MemoryHit]:
        return []

    async def recall(
        self,
        user_id: str,
        viewer: Caller,
        query: str,
        limit: int,
        channel: str = "",
        *,
        spares: int = 0,
        session_id: str = "",
    ) -> list[MemoryHit]:
        return []


# --- Long-term memory as assembly's ``MemorySource``: the adapter the app wires in --------------------

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
        self,
        user_id: str,
        viewer: Caller,
        query: str,
        limit: int,
        channel: str = "",
        *,
        spares: int = 0,
        session_id: str = "",
    ) -> list[MemoryHit]:
        if not query.strip():
            return []
        with spans.search_span(query[-2000:], limit + spares) as span:
            # The version read refreshes this sidecar's view when another wrote; a caller who can see
            # nothing gets [] from the recall index without the query being embedded.
            await self._version(user_id)
            flt = MemoryFilter(
                episodes_from_channel=None if self._cross_channel else channel,
                episodes_not_from_session=session_id,
            )
            query_ = RecallQuery(_who(user_id, viewer), query[-2000:], limit + spares, filter=flt)
            hits = await self._memory.search(query_)
            spans.found(span, ((h.item.id, h.score) for h in hits))
            # A use each for the first ``limit``: the spares are injected only in place of a repeat.
            await self._memory.bump_usage([h.item.id for h in hits[:limit]])
        return [
            MemoryHit(h.item.id, h.item.content, h.score, h.parts, stale=bool(h.item.metadata.get(STALE_KEY)))
            for h in hits
        ]


# --- Procedures, one more gathered input ---------------------------------------------------------------
# What a source returns: one procedure's active version (the name assembly's modules use for it).
ProcedureText = ActiveProcedure


class ProcedureSource(Protocol):
    async def for_agent(self, agent_id: str, groups: Sequence[str]) -> list[ProcedureText]:
        """Active procedures of this agent and of these groups, nobody else's."""
        ...


class NoProcedures:
    async def for_agent(self, agent_id: str, groups: Sequence[str]) -> list[ProcedureText]:
        return []
