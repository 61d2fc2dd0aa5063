"""The high-level layer for the common path, over the full clients (still reachable as ``.client``):

    from memlane import Memlane
    with Memlane("127.0.0.1:50051", agent_id="support-bot") as m:
        m.add("alice", "chat-1", [{"role": "user", "content": "My order 4417 arrived damaged."}])
        messages = m.context("chat-1", "what happened to my order?")  # OpenAI chat format

Sessions are created on first use; ``context`` returns the assembled window (system prompt, profile,
recalled memories, summary, recent turns, then the new question) as chat messages ready for a
chat-completions call. The long-term memories have the lifecycle mem0's ``Memory`` has (``remember``,
``search``, ``get``, ``get_all``, ``update``, ``delete``, ``history``; ``forget_user`` for its
``delete_all``), and ``close_session`` ends a conversation (docs/integrations.md compares the two).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._chat import ChatMessage, chat_from_context, to_messages
from ._client import DEFAULT_TARGET, AsyncClient, Client
from ._errors import NotFoundError
from ._requests import (
    DEFAULT_LIMIT,
    Known,
    context_request,
    history_request,
    list_request,
    next_page,
    no_session,
    update_request,
    with_input,
)
from ._tracing import operation
from .v1.context_pb2 import AssembleContextResponse
from .v1.memory_pb2 import Caller, Memory, MemoryKind, MemoryVersion, ScoredMemory
from .v1.session_pb2 import Message, Session
from .v1.session_service_pb2 import AppendResult

ChatInput = ChatMessage | Mapping[str, Any] | Message


class Memlane:
    """Blocking high-level client. ``agent_id`` names this agent in sessions it creates and memories it
    writes. ``metadata`` and ``interceptors``: as for ``Client`` (extra metadata, gRPC interceptors); the
    caller's OpenTelemetry span, when one is active, is carried on every call."""

    def __init__(
        self,
        target: str | Client = DEFAULT_TARGET,
        *,
        agent_id: str = "",
        channel: str = "",
        token: str | None = None,
        timeout: float = 30.0,
        metadata: Sequence[tuple[str, str]] = (),
        interceptors: Sequence[Any] = (),
    ) -> None:
        # The agent id travels on every call (the x-memlane-agent header), as with Client(agent_id=...):
        # with auth off, a call without one is the unrestricted development caller and reads every
        # agent's private turns. A Client passed in keeps its own identity.
        self.client = (
            target
            if isinstance(target, Client)
            else Client(
                target,
                token=token,
                agent_id=agent_id or None,
                timeout=timeout,
                metadata=metadata,
                interceptors=interceptors,
            )
        )
        self._owns_client = not isinstance(target, Client)
        self.agent_id, self.channel = agent_id, channel
        self._known = Known()

    def __enter__(self) -> Memlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    def _ensure_session(self, user_id: str, session_id: str) -> None:
        if session_id not in self._known:
            self.client.create_session(
                session_id=session_id, user_id=user_id, agent_id=self.agent_id, channel=self.channel
            )
            self._known.add(session_id)

    def _caller(self, user_id: str) -> Caller:
        return Caller(user_id=user_id, agent_id=self.agent_id)

    def add(self, user_id: str, session_id: str, messages: Iterable[ChatInput]) -> list[AppendResult]:
        """Appends chat messages (OpenAI format dicts or ``memlane.Message``) to the session, creating it
        for ``user_id`` on first use; returns one result per message (id, sequence number, token count)."""
        batch = to_messages(messages, self.agent_id)
        with operation("memlane.add"):  # its calls in one trace (see _tracing.operation)
            self._ensure_session(user_id, session_id)
            try:
                return list(self.client.append_messages(session_id=session_id, messages=batch).results)
            except NotFoundError:  # the session was erased or retired since: create it again, once
                self._known.discard(session_id)
                self._ensure_session(user_id, session_id)
                return list(self.client.append_messages(session_id=session_id, messages=batch).results)

    def context(
        self,
        session_id: str,
        user_input: str = "",
        *,
        user_id: str = "",
        include_input: bool = True,
        **options: Any,
    ) -> list[ChatMessage]:
        """The assembled context as OpenAI chat messages, ready for the model call. ``user_input``: the
        new turn (the recall query), returned as the last user message unless ``include_input=False``
        (or it was added to the session first: it is then there once, as the last turn). It is not
        stored: ``add`` it with the reply to keep it in the history. ``user_id``: the session is created
        for that user on first use, as ``add`` does, so the first turn of a new conversation has its
        context (the user's profile and memories); without it, a session nobody created is a
        ``NotFoundError`` that says so. ``options``: any AssembleContextRequest field, such as
        ``model``, ``context_window_tokens``, ``reserved_output_tokens`` or ``system_prompt``."""
        request = context_request(session_id, user_input, options)
        with operation("memlane.context"):
            if user_id:
                self._ensure_session(user_id, session_id)
            try:
                responses = list(self.client.assemble_context(**request))
            except NotFoundError as err:
                if not user_id:
                    raise no_session(err, session_id) from None
                self._known.discard(session_id)  # erased or retired since: create it again, once
                self._ensure_session(user_id, session_id)
                responses = list(self.client.assemble_context(**request))
        return with_input(chat_from_context(responses), user_input, include_input)

    def search(
        self, user_id: str, query: str, *, limit: int = 10, min_score: float = 0.0
    ) -> list[ScoredMemory]:
        """Long-term memories of the user this agent may read, best first, with their score parts;
        ``min_score`` leaves out results whose final score is below it (weak matches)."""
        reply = self.client.search_memories(
            caller=self._caller(user_id), query=query, limit=limit, min_score=min_score
        )
        return list(reply.results)

    def remember(
        self,
        user_id: str,
        content: str,
        *,
        kind: MemoryKind.ValueType = MemoryKind.MEMORY_KIND_FACT,
        slot: str = "",
    ) -> str:
        """Stores a fact (or a preference, instruction, episode) about the user; returns the memory id
        (that of an existing memory when this one merged into it). ``slot`` names the single-valued
        attribute it states ("location", "units"): a newer value in the same slot supersedes the older
        one (kept in ``history``, no longer served)."""
        reply = self.client.create_memory(caller=self._caller(user_id), kind=kind, content=content, slot=slot)
        return str(reply.memory.memory_id)

    def get(self, user_id: str, memory_id: str) -> Memory:
        """One memory of the user that this agent may read; ``NotFoundError`` when there is none."""
        return self.client.get_memory(caller=self._caller(user_id), memory_id=memory_id).memory

    def get_all(
        self, user_id: str, *, kinds: Iterable[MemoryKind.ValueType] = (), limit: int = DEFAULT_LIMIT
    ) -> list[Memory]:
        """The user's memories this agent may read, newest first, ``limit`` at most (paged through);
        ``kinds`` narrows them (empty: every kind). Superseded and deleted ones are in ``history``."""
        request = list_request(self._caller(user_id), kinds, limit)
        out: list[Memory] = []
        while True:
            page = self.client.list_memories(request)
            if not next_page(out, page.memories, page.next_page_token, request, limit):
                return out

    def update(
        self,
        user_id: str,
        memory_id: str,
        content: str | None = None,
        *,
        kind: MemoryKind.ValueType | None = None,
        slot: str | None = None,
        importance: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> Memory:
        """Changes the fields given (new content is embedded again), each change kept as a version;
        returns the memory as it is now. ``NotFoundError`` for a memory this agent may not read."""
        request = update_request(
            self._caller(user_id),
            memory_id,
            content=content,
            kind=kind,
            slot=slot,
            importance=importance,
            metadata=metadata,
        )
        return self.client.update_memory(request).memory

    def delete(self, user_id: str, memory_id: str) -> None:
        """Deletes one memory (its versions stay in ``history`` for the whole-user view);
        ``NotFoundError`` when there is none this agent may read."""
        self.client.delete_memory(caller=self._caller(user_id), memory_id=memory_id)

    def history(self, user_id: str, memory_id: str, *, limit: int = DEFAULT_LIMIT) -> list[MemoryVersion]:
        """The kept versions of one memory, oldest first (created, merged into, edited, superseded,
        deleted: who, when, why, and the memory as each change left it), ``limit`` at most. An agent
        gets ``NotFoundError`` for a memory it may not read; a caller naming no agent (the whole-user
        view) also sees deleted memories' versions, and an empty list for an id never stored."""
        request = history_request(self._caller(user_id), memory_id, limit)
        out: list[MemoryVersion] = []
        while True:
            page = self.client.list_memory_versions(request)
            if not next_page(out, page.versions, page.next_page_token, request, limit):
                return out

    def close_session(self, session_id: str) -> Session:
        """Ends the conversation now (what its inactivity timeout would do: summary, promotion to
        long-term memory, archive, in the background); returns the closed session. ``close()`` closes
        this client's connection instead."""
        return self.client.close_session(session_id=session_id).session

    def forget_user(self, user_id: str) -> dict[str, int]:
        """Erases everything held about the user (sessions, memories, archives); counts by kind. An
        operator's call: the caller needs the admin role (with auth off, a client naming no agent)."""
        self._known = Known()
        return dict(self.client.forget_user(user_id=user_id).erased)


class AsyncMemlane:
    """asyncio version of ``Memlane``: the same methods, awaited."""

    def __init__(
        self,
        target: str | AsyncClient = DEFAULT_TARGET,
        *,
        agent_id: str = "",
        channel: str = "",
        token: str | None = None,
        timeout: float = 30.0,
        metadata: Sequence[tuple[str, str]] = (),
        interceptors: Sequence[Any] = (),
    ) -> None:
        self.client = (
            target
            if isinstance(target, AsyncClient)
            else AsyncClient(
                target,
                token=token,
                agent_id=agent_id or None,
                timeout=timeout,
                metadata=metadata,
                interceptors=interceptors,
            )
        )
        self._owns_client = not isinstance(target, AsyncClient)
        self.agent_id, self.channel = agent_id, channel
        self._known = Known()

    async def __aenter__(self) -> AsyncMemlane:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_client:
            await self.client.close()

    async def _ensure_session(self, user_id: str, session_id: str) -> None:
        if session_id not in self._known:
            await self.client.create_session(
                session_id=session_id, user_id=user_id, agent_id=self.agent_id, channel=self.channel
            )
            self._known.add(session_id)

    def _caller(self, user_id: str) -> Caller:
        return Caller(user_id=user_id, agent_id=self.agent_id)

    async def add(self, user_id: str, session_id: str, messages: Iterable[ChatInput]) -> list[AppendResult]:
        """See ``Memlane.add``."""
        batch = to_messages(messages, self.agent_id)
        with operation("memlane.add"):
            await self._ensure_session(user_id, session_id)
            try:
                reply = await self.client.append_messages(session_id=session_id, messages=batch)
            except NotFoundError:
                self._known.discard(session_id)
                await self._ensure_session(user_id, session_id)
                reply = await self.client.append_messages(session_id=session_id, messages=batch)
        return list(reply.results)

    async def context(
        self,
        session_id: str,
        user_input: str = "",
        *,
        user_id: str = "",
        include_input: bool = True,
        **options: Any,
    ) -> list[ChatMessage]:
        """See ``Memlane.context``."""
        request = context_request(session_id, user_input, options)
        with operation("memlane.context"):
            if user_id:
                await self._ensure_session(user_id, session_id)
            try:
                responses = await self._assemble(request)
            except NotFoundError as err:
                if not user_id:
                    raise no_session(err, session_id) from None
                self._known.discard(session_id)
                await self._ensure_session(user_id, session_id)
                responses = await self._assemble(request)
        return with_input(chat_from_context(responses), user_input, include_input)

    async def _assemble(self, request: dict[str, Any]) -> list[AssembleContextResponse]:
        return [r async for r in self.client.assemble_context(**request)]

    async def search(
        self, user_id: str, query: str, *, limit: int = 10, min_score: float = 0.0
    ) -> list[ScoredMemory]:
        """See ``Memlane.search``."""
        reply = await self.client.search_memories(
            caller=self._caller(user_id), query=query, limit=limit, min_score=min_score
        )
        return list(reply.results)

    async def remember(
        self,
        user_id: str,
        content: str,
        *,
        kind: MemoryKind.ValueType = MemoryKind.MEMORY_KIND_FACT,
        slot: str = "",
    ) -> str:
        """See ``Memlane.remember``."""
        reply = await self.client.create_memory(
            caller=self._caller(user_id), kind=kind, content=content, slot=slot
        )
        return str(reply.memory.memory_id)

    async def get(self, user_id: str, memory_id: str) -> Memory:
        """See ``Memlane.get``."""
        return (await self.client.get_memory(caller=self._caller(user_id), memory_id=memory_id)).memory

    async def get_all(
        self, user_id: str, *, kinds: Iterable[MemoryKind.ValueType] = (), limit: int = DEFAULT_LIMIT
    ) -> list[Memory]:
        """See ``Memlane.get_all``."""
        request = list_request(self._caller(user_id), kinds, limit)
        out: list[Memory] = []
        while True:
            page = await self.client.list_memories(request)
            if not next_page(out, page.memories, page.next_page_token, request, limit):
                return out

    async def update(
        self,
        user_id: str,
        memory_id: str,
        content: str | None = None,
        *,
        kind: MemoryKind.ValueType | None = None,
        slot: str | None = None,
        importance: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> Memory:
        """See ``Memlane.update``."""
        request = update_request(
            self._caller(user_id),
            memory_id,
            content=content,
            kind=kind,
            slot=slot,
            importance=importance,
            metadata=metadata,
        )
        return (await self.client.update_memory(request)).memory

    async def delete(self, user_id: str, memory_id: str) -> None:
        """See ``Memlane.delete``."""
        await self.client.delete_memory(caller=self._caller(user_id), memory_id=memory_id)

    async def history(
        self, user_id: str, memory_id: str, *, limit: int = DEFAULT_LIMIT
    ) -> list[MemoryVersion]:
        """See ``Memlane.history``."""
        request = history_request(self._caller(user_id), memory_id, limit)
        out: list[MemoryVersion] = []
        while True:
            page = await self.client.list_memory_versions(request)
            if not next_page(out, page.versions, page.next_page_token, request, limit):
                return out

    async def close_session(self, session_id: str) -> Session:
        """See ``Memlane.close_session``."""
        return (await self.client.close_session(session_id=session_id)).session

    async def forget_user(self, user_id: str) -> dict[str, int]:
        """See ``Memlane.forget_user``."""
        self._known = Known()
        return dict((await self.client.forget_user(user_id=user_id)).erased)
