"""MemoryService: long-term memory over gRPC. Proto <-> domain only; domain errors propagate to the
boundary interceptor, which maps them to status codes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TypeAlias

import grpc

from memlane.v1 import memory_pb2 as mpb
from memlane.v1 import memory_pb2_grpc as mpb_grpc

from ..access.identity import AGENT, GROUP, SESSION, Caller, current_caller
from ..embedding.admission import EmbeddingAdmission
from ..errors import InvalidArgument, PermissionDenied
from ..extraction import Extractor, build_episodes
from ..ids import check_id
from ..ltm import (
    Feedback,
    MemoryFilter,
    MemoryItem,
    MemoryKind,
    MemoryPatch,
    MemoryScope,
    MemoryService,
    NewMemory,
    Owner,
    RecallQuery,
    ScoreParts,
    SearchMode,
    Visibility,
    default_scope,
)
from ..ltm.operations import MemoryMerge
from ..ltm.recall import check_texts
from ..ltm.redis_state import OnceMarks
from ..observability import spans
from ..sessions.limits import Limits, check_batch, check_list, check_metadata, check_short, check_timestamp
from ..sessions.model import Session
from ..sessions.store import now_ms
from .convert import message_from_pb
from .enums import INGEST_OUTCOME, MEMORY_KIND, MEMORY_SCOPE

# grpcio is untyped; the alias documents what the handlers receive.
_Ctx: TypeAlias = grpc.aio.ServicerContext

_MODE_FROM_PB = {
    mpb.SEARCH_MODE_UNSPECIFIED: SearchMode.HYBRID,
    mpb.SEARCH_MODE_HYBRID: SearchMode.HYBRID,
    mpb.SEARCH_MODE_KEYWORD: SearchMode.KEYWORD,
    mpb.SEARCH_MODE_VECTOR: SearchMode.VECTOR,
}
_UPDATABLE = {"content", "keywords", "importance", "kind", "scope", "slot", "metadata", "valid_until_unix_ms"}


def _kind(value: int, field: str = "kind") -> MemoryKind:
    kind = MEMORY_KIND.from_pb(value)
    if kind is None:
        raise InvalidArgument(f"{field} must be a known MemoryKind, got {value}")
    return kind


def _scope(value: int, field: str = "scope") -> MemoryScope:
    scope = MEMORY_SCOPE.from_pb(value)
    if scope is None:
        raise InvalidArgument(f"{field} must be a known MemoryScope, got {value}")
    return scope


def _who(requested: mpb.Caller, *, write: bool = False) -> Visibility:
    """The LTM view a request may use: the user it names, seen as the authenticated caller. The agent
    and groups in the request may narrow what the caller is, never widen it."""
    # Every id field was checked against the grammar at the boundary (api/interceptor.py); these
    # checks add what is required.
    check_id(requested.user_id, "caller.user_id")
    me = current_caller()
    if me.unrestricted:
        return Visibility(requested.user_id, requested.agent_id, list(requested.groups))
    agent = requested.agent_id or ("" if me.is_auditor else me.agent_id)  # "": the whole user's memory
    if agent != me.agent_id and (write or not me.reads_for(agent)):
        raise PermissionDenied(f"caller.agent_id {agent!r} is not the calling agent {me.agent_id!r}")
    groups = list(requested.groups) or sorted(me.groups)
    foreign = [g for g in groups if g not in me.groups]
    if foreign and not me.is_auditor:
        raise PermissionDenied(f"agent {me.agent_id!r} is not a member of group {foreign[0]!r}")
    return Visibility(requested.user_id, agent, groups)


# A memory's scope as the visibility of a message, so one rule (``Caller.check_write``) decides both.
_SCOPE_AS_VISIBILITY = {
    MemoryScope.USER: SESSION,
    MemoryScope.SHARED: SESSION,
    MemoryScope.AGENT: AGENT,
    MemoryScope.GROUP: GROUP,
}


def _check_scope_write(me: Caller, scope: MemoryScope, agent_id: str, group: str, field: str) -> None:
    """May ``me`` put an item into ``scope``? The write rule of messages: only members write into a
    group, only the owning agent into agent scope; user and shared scope are open to any agent serving
    the user (what a user binding restricts, see access/), never to an auditor."""
    # Only agent scope names an owner (the item's agent); a group or user item is anyone's to write.
    owner = agent_id if scope is MemoryScope.AGENT else ""
    me.check_write(_SCOPE_AS_VISIBILITY[scope], owner, group if scope is MemoryScope.GROUP else "", field)


def _filter(f: mpb.MemoryFilter, *, allow_retired: bool) -> MemoryFilter:
    if f.include_retired and not allow_retired:
        raise InvalidArgument("filter.include_retired is only for ListMemories and GetMemory")
    if f.since_unix_ms and f.until_unix_ms and f.since_unix_ms >= f.until_unix_ms:
        raise InvalidArgument("filter.since_unix_ms must be before filter.until_unix_ms")
    return MemoryFilter(
        kinds=[_kind(k, "filter.kinds") for k in f.kinds],
        scopes=[_scope(s, "filter.scopes") for s in f.scopes],
        channel=f.channel,
        since_ms=f.since_unix_ms,
        until_ms=f.until_unix_ms,
        include_retired=f.include_retired,
    )


def score_parts_to_pb(p: ScoreParts) -> mpb.ScoreParts:
    return mpb.ScoreParts(
        keyword_rank=p.keyword_rank,
        keyword_score=p.keyword_score,
        vector_rank=p.vector_rank,
        vector_similarity=p.vector_similarity,
        fused=p.fused,
        recency=p.recency,
        usage=p.usage,
        importance=p.importance,
        final=p.final,
    )


def memory_to_pb(m: MemoryItem) -> mpb.Memory:
    return mpb.Memory(
        memory_id=m.id,
        user_id=m.user_id,
        agent_id=m.agent_id,
        scope=MEMORY_SCOPE.to_pb(m.scope),
        group=m.group,
        kind=MEMORY_KIND.to_pb(m.kind),
        content=m.content,
        keywords=m.keywords,
        slot=m.slot,
        importance=m.importance,
        usage_count=m.usage_count,
        useful_count=m.useful_count,
        wrong_count=m.wrong_count,
        last_used_at_unix_ms=m.last_used_at_ms,
        created_at_unix_ms=m.created_at_ms,
        updated_at_unix_ms=m.updated_at_ms,
        occurred_at_unix_ms=m.occurred_at_ms,
        source_session_id=m.source_session_id,
        source_message_ids=m.source_message_ids,
        channel=m.channel,
        superseded_by=m.superseded_by,
        valid_until_unix_ms=m.valid_until_ms,
        metadata=m.metadata,
    )


def _check_bounds(keywords: Sequence[str], metadata: Mapping[str, str], prefix: str, limits: Limits) -> None:
    """Lists and maps a caller sends are bounded like a message's (entries and bytes per entry)."""
    check_list(keywords, f"{prefix}keywords", limits)
    check_metadata(dict(metadata), f"{prefix}metadata", limits)


class MemoryServicer(mpb_grpc.MemoryServiceServicer):
    def __init__(
        self,
        memory: MemoryService,
        extractor: Extractor,
        feedback_marks: OnceMarks,
        admission: EmbeddingAdmission,
        *,
        limits: Limits,
    ) -> None:
        self._memory = memory
        self._limits = limits  # the configured ones, as AppendMessages takes (wiring/stores.py)
        self._merge = MemoryMerge(memory)
        self._extractor = extractor
        self._feedback_marks = feedback_marks
        # What callers' texts may cost the model, per call and in flight (embedding/admission.py).
        self._admission = admission

    async def SearchMemories(
        self, request: mpb.SearchMemoriesRequest, context: _Ctx
    ) -> mpb.SearchMemoriesResponse:
        mode = _MODE_FROM_PB.get(request.mode)
        if mode is None:
            raise InvalidArgument(f"mode must be a known SearchMode, got {request.mode}")
        who = _who(request.caller)
        query = RecallQuery(
            # No agent: the whole user's memory, as GetMemory and ListMemories read it (``readable``).
            who=who if who.agent_id else replace(who, every_agent=True),
            text=request.query,
            limit=request.limit or 10,
            filter=_filter(request.filter, allow_retired=False),
            mode=mode,
            min_score=request.min_score,
            vector=tuple(request.query_vector),
        )
        with spans.search_span(request.query, query.limit) as span:
            hits = await self._memory.search(query)
            spans.found(span, ((h.item.id, h.score) for h in hits))
        return mpb.SearchMemoriesResponse(
            results=[
                mpb.ScoredMemory(
                    memory=memory_to_pb(h.item),
                    score=h.score,
                    parts=score_parts_to_pb(h.parts),
                )
                for h in hits
            ]
        )

    async def Embed(self, request: mpb.EmbedRequest, context: _Ctx) -> mpb.EmbedResponse:
        check_texts(request.texts)  # the call's own bounds first: they name the text at fault
        async with self._admission.admit(request.texts, "texts"):
            vectors = await self._memory.embed(list(request.texts))
        return mpb.EmbedResponse(
            embeddings=[mpb.Embedding(values=v.tolist()) for v in vectors],
            dimensions=int(vectors.shape[1]),
        )

    async def GetProfile(self, request: mpb.GetProfileRequest, context: _Ctx) -> mpb.GetProfileResponse:
        if request.max_items < 0 or request.max_chars < 0:
            raise InvalidArgument("max_items and max_chars must not be negative")
        profile = await self._memory.profile(
            _who(request.caller), max_items=request.max_items, max_chars=request.max_chars
        )
        return mpb.GetProfileResponse(
            instructions=[memory_to_pb(m) for m in profile.instructions],
            preferences=[memory_to_pb(m) for m in profile.preferences],
            facts=[memory_to_pb(m) for m in profile.facts],
        )

    async def CreateMemory(self, request: mpb.CreateMemoryRequest, context: _Ctx) -> mpb.CreateMemoryResponse:
        who = _who(request.caller, write=True)
        if not 0.0 <= request.importance <= 1.0:
            raise InvalidArgument("importance must be between 0 and 1")
        kind = _kind(request.kind)
        scope = _scope(request.scope) if request.scope else default_scope(kind)
        _check_scope_write(current_caller(), scope, who.agent_id, request.group, "memory")
        _check_bounds(request.keywords, request.metadata, "", self._limits)
        check_list(request.source_message_ids, "source_message_ids", self._limits)
        check_timestamp(request.occurred_at_unix_ms, "occurred_at_unix_ms", now_ms())
        draft = NewMemory(
            kind=kind.value,
            content=request.content,
            keywords=list(request.keywords),
            slot=request.slot,
            importance=request.importance or 0.5,
            source_message_ids=list(request.source_message_ids),
            occurred_at_ms=request.occurred_at_unix_ms,
            scope=scope.value,
            group=request.group,
            memory_id=request.memory_id,
            metadata=dict(request.metadata),
            valid_until_ms=request.valid_until_unix_ms,
        )
        owner = Owner(who.user_id, who.agent_id, request.channel, request.source_session_id)
        with spans.memory_span(spans.CREATE) as span:
            async with self._admission.admit([request.content], "content"):
                result = await self._memory.create(owner, draft)
            spans.wrote(span, result.item.id)
        return mpb.CreateMemoryResponse(
            memory=memory_to_pb(result.item),
            outcome=INGEST_OUTCOME.to_pb(result.outcome),
            superseded_ids=result.superseded_ids,
        )

    async def GetMemory(self, request: mpb.GetMemoryRequest, context: _Ctx) -> mpb.GetMemoryResponse:
        check_id(request.memory_id, "memory_id")
        item = await self._memory.get(_who(request.caller), request.memory_id)
        return mpb.GetMemoryResponse(memory=memory_to_pb(item))

    async def ListMemories(self, request: mpb.ListMemoriesRequest, context: _Ctx) -> mpb.ListMemoriesResponse:
        page = await self._memory.list_items(
            _who(request.caller),
            _filter(request.filter, allow_retired=True),
            page_size=request.page_size,
            page_token=request.page_token,
        )
        return mpb.ListMemoriesResponse(
            memories=[memory_to_pb(m) for m in page.items],
            next_page_token=page.next_page_token,
            total_size=page.total,
        )

    async def UpdateMemory(self, request: mpb.UpdateMemoryRequest, context: _Ctx) -> mpb.UpdateMemoryResponse:
        paths = set(request.update_mask.paths)
        if not paths:
            raise InvalidArgument("update_mask must name at least one field")
        unknown = paths - _UPDATABLE
        if unknown:
            raise InvalidArgument(f"update_mask: cannot update {', '.join(sorted(unknown))}")
        m = request.memory
        check_id(m.memory_id, "memory.memory_id")
        if "importance" in paths and not 0.0 <= m.importance <= 1.0:
            raise InvalidArgument("importance must be between 0 and 1")
        _check_bounds(m.keywords, m.metadata, "memory.", self._limits)
        patch = MemoryPatch(
            content=m.content if "content" in paths else None,
            keywords=list(m.keywords) if "keywords" in paths else None,
            importance=m.importance if "importance" in paths else None,
            kind=_kind(m.kind, "memory.kind") if "kind" in paths else None,
            scope=_scope(m.scope, "memory.scope") if "scope" in paths else None,
            slot=m.slot if "slot" in paths else None,
            metadata=dict(m.metadata) if "metadata" in paths else None,
            valid_until_ms=m.valid_until_unix_ms if "valid_until_unix_ms" in paths else None,
        )
        who = _who(request.caller, write=True)
        if patch.scope is not None:
            current = await self._memory.get(who, m.memory_id)
            _check_scope_write(current_caller(), patch.scope, current.agent_id, current.group, "memory")
        with spans.memory_span(spans.UPDATE, **{"gen_ai.memory.record.id": m.memory_id}):
            async with self._admission.admit(
                [patch.content] if patch.content is not None else [], "memory.content"
            ):
                item = await self._memory.update(who, m.memory_id, patch)
        return mpb.UpdateMemoryResponse(memory=memory_to_pb(item))

    async def MergeMemories(
        self, request: mpb.MergeMemoriesRequest, context: _Ctx
    ) -> mpb.MergeMemoriesResponse:
        who = _who(request.caller, write=True)
        for i, memory_id in enumerate(request.memory_ids):
            check_id(memory_id, f"memory_ids[{i}]")
        check_short(request.slot, "slot", self._limits)
        async with self._admission.admit([request.content] if request.content else [], "content"):
            item, superseded = await self._merge.merge(
                who,
                list(request.memory_ids),
                content=request.content,
                kind=_kind(request.kind) if request.kind else None,
                slot=request.slot,
            )
        return mpb.MergeMemoriesResponse(memory=memory_to_pb(item), superseded_ids=superseded)

    async def DeleteMemory(self, request: mpb.DeleteMemoryRequest, context: _Ctx) -> mpb.DeleteMemoryResponse:
        check_id(request.memory_id, "memory_id")
        with spans.memory_span(spans.DELETE, **{"gen_ai.memory.record.id": request.memory_id}):
            await self._memory.delete(_who(request.caller, write=True), request.memory_id)
        return mpb.DeleteMemoryResponse()

    async def RecordFeedback(
        self, request: mpb.RecordFeedbackRequest, context: _Ctx
    ) -> mpb.RecordFeedbackResponse:
        verdicts = {mpb.FEEDBACK_VERDICT_USEFUL: Feedback.USEFUL, mpb.FEEDBACK_VERDICT_WRONG: Feedback.WRONG}
        verdict = verdicts.get(request.verdict)
        if verdict is None:
            raise InvalidArgument("verdict must be FEEDBACK_VERDICT_USEFUL or FEEDBACK_VERDICT_WRONG")
        check_id(request.memory_id, "memory_id")
        who, fid = _who(request.caller, write=True), request.feedback_id
        if fid and not await self._feedback_marks.claim(who.user_id, fid, "feedback_id"):
            # A retry of feedback already counted: answer with the memory as it is now.
            return mpb.RecordFeedbackResponse(
                memory=memory_to_pb(await self._memory.get(who, request.memory_id))
            )
        try:
            item = await self._memory.feedback(who, request.memory_id, verdict)
        except Exception:
            if fid:  # refused or failed before writing: a retry must count
                await self._feedback_marks.release(who.user_id, fid)
            raise
        return mpb.RecordFeedbackResponse(memory=memory_to_pb(item))

    async def ExtractMemories(
        self, request: mpb.ExtractMemoriesRequest, context: _Ctx
    ) -> mpb.ExtractMemoriesResponse:
        who = _who(request.caller, write=True)
        if not request.messages:
            raise InvalidArgument("messages must not be empty")
        messages = [message_from_pb(m, i) for i, m in enumerate(request.messages)]
        check_batch(messages, self._limits, now_ms())  # the same bounds as AppendMessages
        for i, msg in enumerate(messages):
            msg.message_id = msg.message_id or f"{request.session_id or 'inline'}:{i + 1}"
        session = Session(
            session_id=request.session_id, user_id=who.user_id, agent_id=who.agent_id, channel=request.channel
        )
        result = await self._extractor.extract(messages, session)
        drafts = [*result.memories, *(build_episodes(messages, session) if request.include_episodes else [])]
        response = mpb.ExtractMemoriesResponse(
            rejected_pii=result.rejected_pii,
            rejected_picky=result.rejected_picky,
            tokens_in=result.tokens_in,
            tokens_out=result.tokens_out,
        )
        if request.dry_run:
            for d in drafts:
                response.memories.add(
                    memory=mpb.Memory(
                        user_id=who.user_id,
                        agent_id=who.agent_id,
                        kind=_kind_of(d.kind),
                        content=d.content,
                        keywords=d.keywords,
                        slot=d.slot,
                        importance=d.importance,
                        source_message_ids=d.source_message_ids,
                        occurred_at_unix_ms=d.occurred_at_ms,
                        source_session_id=request.session_id,
                        channel=request.channel,
                    ),
                    outcome=mpb.INGEST_OUTCOME_UNSPECIFIED,
                )
            return response
        owner = Owner(who.user_id, who.agent_id, request.channel, request.session_id)
        async with self._admission.admit([d.content for d in drafts], "messages"):
            results = await self._memory.ingest(owner, drafts)
        for r in results:
            response.memories.add(
                memory=memory_to_pb(r.item),
                outcome=INGEST_OUTCOME.to_pb(r.outcome),
                superseded_ids=r.superseded_ids,
            )
        return response


def _kind_of(value: str) -> mpb.MemoryKind.ValueType:
    return MEMORY_KIND.to_pb(MemoryKind(value))
