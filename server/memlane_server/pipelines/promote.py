"""Promotion: a session's turns become long-term memories, exactly once however often it is re-run.

Each candidate memory gets an id derived from the session, its kind, the messages it came from and its
text (``mem_<occurred ms><digest>``, the shape of ``ltm.new_memory_id`` so ids still sort by time). Before
ingesting, ids already in the store are skipped; ingestion itself folds a re-stated fact into the item it
repeats and skips an episode it already holds. So a crash anywhere in a chunk, followed by a re-run of
that chunk, adds nothing twice.

A memory derived from a message may never be visible to a reader who could not read that message. So
the turns are promoted per audience (``Audience``: who could read them), each audience on its own:
extraction and episode building see only that audience's turns (an LLM extractor cannot blend a private
turn into a shared fact, an episode's neighbour keywords come from turns the same readers saw), and the
items land in the matching scope, owned by the agent that wrote the turn.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass
from typing import Protocol

from ..errors import MemlaneError, Unavailable
from ..extraction import ExtractedMemory, Extractor, build_episodes
from ..ltm import MemoryScope, MemoryService, NewMemory, Owner
from ..ltm.filters import owned_by, with_ids
from ..observability import spans
from ..procedures import ProcedureService, proposal_from
from ..sessions.model import Message, Session, VisibilityKind

log = logging.getLogger(__name__)


class Promoter(Protocol):
    async def promote(self, session: Session, messages: list[Message]) -> list[str]:
        """Promotes ``messages`` (a whole number of exchanges, oldest first); returns the ids of the
        memories they produced or merged into. Idempotent for the same messages."""
        ...


def memory_id_for(session_id: str, draft: ExtractedMemory) -> str:
    key = "\x1f".join([session_id, draft.kind, ",".join(draft.source_message_ids), draft.content.strip()])
    digest = hashlib.blake2b(key.encode(), digest_size=8).hexdigest()
    return f"mem_{max(draft.occurred_at_ms, 0):012x}{digest}"


@dataclass(frozen=True, slots=True)
class Audience:
    """Who could read a turn, as the owner and scope its memories get.

    ``scope`` empty: the kind's default scope (facts and preferences USER, instructions and episodes
    AGENT), allowed only for session-wide turns: only those may become user-scope memories.
    """

    agent_id: str
    scope: str = ""
    group: str = ""


def audience_of(message: Message, session: Session) -> Audience:
    """The memory's agent is the message's source agent. A session-wide or group turn without one (a
    single-agent app that never names agents) falls back to the session's agent: every reader of the
    session could read such a turn anyway. A private turn never does: its reader is exactly its source."""
    writer = message.source_agent_id or session.agent_id
    if message.visibility == VisibilityKind.SESSION:
        return Audience(writer)
    if message.visibility == VisibilityKind.GROUP and message.visibility_group:
        return Audience(writer, MemoryScope.GROUP.value, message.visibility_group)
    # Agent-private, and anything unexpected: the narrowest audience (fail closed).
    return Audience(message.source_agent_id, MemoryScope.AGENT.value)


class LtmPromoter:
    """``Promoter`` over the rule-based (or LLM) extractor, episode builder and ``ltm.MemoryService``."""

    def __init__(
        self, memory: MemoryService, extractor: Extractor, *, episodes: bool = True, learnt: bool = False
    ) -> None:
        """``learnt``: promotion while the session is open (learning), whose writes other processes take
        in behind their reads (ltm/core.py ``Freshness``); a session end's stay writes a caller may wait
        to read (PromoteSession)."""
        self._memory = memory
        self._extractor = extractor
        self._episodes = episodes
        self._learnt = learnt

    async def promote(self, session: Session, messages: list[Message]) -> list[str]:
        audiences: dict[Audience, list[Message]] = {}
        for m in messages:
            if not m.transient:
                audiences.setdefault(audience_of(m, session), []).append(m)
        out: list[str] = []
        for audience, turns in audiences.items():
            out += await self._promote_audience(session, audience, turns)
        return list(dict.fromkeys(out))

    async def _promote_audience(self, session: Session, audience: Audience, kept: list[Message]) -> list[str]:
        result = await self._extractor.extract(kept, session)
        drafts = list(result.memories)
        if self._episodes:
            # Keyword extraction and PII redaction over every turn: off the event loop.
            drafts += await asyncio.to_thread(build_episodes, kept, session)
        if not drafts:
            return []
        ids = [memory_id_for(session.session_id, d) for d in drafts]
        mine = owned_by(session.user_id) & with_ids(ids)  # an id another user holds is not this one's
        existing = {i.id for i in await self._memory.store.fetch(mine)}
        fresh = [
            NewMemory(
                kind=d.kind,
                content=d.content,
                keywords=list(d.keywords),
                slot=d.slot,
                importance=d.importance,
                source_message_ids=list(d.source_message_ids),
                occurred_at_ms=d.occurred_at_ms,
                memory_id=mid,
                scope=audience.scope,
                group=audience.group,
                metadata=dict(d.metadata),
            )
            for d, mid in zip(drafts, ids, strict=True)
            if mid not in existing
        ]
        owner = Owner(session.user_id, audience.agent_id, session.channel, session.session_id)
        results = []
        if fresh:
            with spans.memory_span(spans.CREATE) as span:  # the job's writes, in its trace
                results = await self._memory.ingest(owner, fresh, learnt=self._learnt)
                spans.wrote(span, "", len(results))
        out = [i for i in ids if i in existing]
        out += [r.item.id for r in results]
        return out


class ExtractingPromoter:
    """A ``Promoter`` that also proposes an example procedure from a successful session
    (``procedures/service.py``), then promotes as before."""

    def __init__(self, inner: Promoter, procedures: ProcedureService) -> None:
        self._inner = inner
        self._procedures = procedures

    async def promote(self, session: Session, messages: list[Message]) -> list[str]:
        ids = await self._inner.promote(session, messages)
        proposal = proposal_from(session, messages)
        if proposal is not None:
            try:
                await self._procedures.propose(proposal)
            except Unavailable:
                raise  # the model process or a store is down: the job is retried, the proposal with it
            except MemlaneError as exc:  # personal data, limits: the session's promotion still counts
                log.info("no procedure proposed from the session", extra={"reason": str(exc)})
        return ids
