"""The high-level layer for the common path, over the full clients (still reachable as ``.client``):

    from memlane import Memlane
    with Memlane("127.0.0.1:50051", agent_id="support-bot") as m:
        m.add("alice", "chat-1", [{"role": "user", "content": "My order 4417 arrived damaged."}])
        messages = m.context("chat-1", "what happened to my order?")  # OpenAI chat format

Sessions are created on first use; ``context`` returns the assembled window (system prompt, profile,
recalled memories, summary, recent turns, then the new question) as chat messages ready for a
chat-completions call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._chat import ChatMessage, chat_from_context, to_messages
from ._client import DEFAULT_TARGET, AsyncClient, Client
from ._errors import NotFoundError
from ._tracing import operation
from .v1.context_pb2 import AssembleContextResponse
from .v1.memory_pb2 import Caller, MemoryKind, ScoredMemory
from .v1.session_pb2 import Message
from .v1.session_service_pb2 import AppendResult

ChatInput = ChatMessage | Mapping[str, Any] | Message
_KNOWN_SESSIONS = 10_000  # session ids remembered as created, so add() costs one round trip after the first


class _Known:
    """A bounded set of session ids this process created (or found existing)."""

    def __init__(self) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._ids

    def add(self, session_id: str) -> None:
        self._ids[session_id] = None
        self._ids.move_to_end(session_id)
        while len(self._ids) > _KNOWN_SESSIONS:
            self._ids.popitem(last=False)

    def discard(self, session_id: str) -> None:
        self._ids.pop(session_id, None)


def _context_request(session_id: str, user_input: str, options: Mapping[str, Any]) -> dict[str, Any]:
    return {"session_id": session_id, "user_input": user_input, **options}


def _with_input(chat: list[ChatMessage], user_input: str, include: bool) -> list[ChatMessage]:
    """The window ends with the new question, ready to send: the server charged it to the budget. Not
    twice when it was added first (then it is already the session's last turn)."""
    if not include or not user_input:
        return chat
    if chat and chat[-1].get("role") == "user" and chat[-1].get("content") == user_input:
        return chat
    return [*chat, {"role": "user", "content": user_input}]


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
        self._known = _Known()

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
        self, session_id: str, user_input: str = "", *, include_input: bool = True, **options: Any
    ) -> list[ChatMessage]:
        """The assembled context as OpenAI chat messages, ready for the model call. ``user_input``: the
        new turn (the recall query), returned as the last user message unless ``include_input=False``
        (or it was added to the session first: it is then there once, as the last turn). It is not
        stored: ``add`` it with the reply to keep it in the history. ``options``: any
        AssembleContextRequest field, such as ``model``, ``context_window_tokens``,
        ``reserved_output_tokens`` or ``system_prompt``."""
        stream = self.client.assemble_context(**_context_request(session_id, user_input, options))
        responses: list[AssembleContextResponse] = list(stream)
        return _with_input(chat_from_context(responses), user_input, include_input)

    def search(
        self, user_id: str, query: str, *, limit: int = 10, min_score: float = 0.0
    ) -> list[ScoredMemory]:
        """Long-term memories of the user this agent may read, best first, with their score parts;
        ``min_score`` leaves out results whose final score is below it (weak matches)."""
        caller = Caller(user_id=user_id, agent_id=self.agent_id)
        reply = self.client.search_memories(caller=caller, query=query, limit=limit, min_score=min_score)
        return list(reply.results)

    def remember(
        self, user_id: str, content: str, *, kind: MemoryKind.ValueType = MemoryKind.MEMORY_KIND_FACT
    ) -> str:
        """Stores a fact (or a preference, instruction, episode) about the user; returns the memory id
        (that of an existing memory when this one merged into it)."""
        caller = Caller(user_id=user_id, agent_id=self.agent_id)
        return str(self.client.create_memory(caller=caller, kind=kind, content=content).memory.memory_id)

    def forget_user(self, user_id: str) -> dict[str, int]:
        """Erases everything held about the user (sessions, memories, archives); counts by kind. An
        operator's call: the caller needs the admin role (with auth off, a client naming no agent)."""
        self._known = _Known()
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
        self._known = _Known()

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
        self, session_id: str, user_input: str = "", *, include_input: bool = True, **options: Any
    ) -> list[ChatMessage]:
        """See ``Memlane.context``."""
        stream = self.client.assemble_context(**_context_request(session_id, user_input, options))
        responses: list[AssembleContextResponse] = [r async for r in stream]
        return _with_input(chat_from_context(responses), user_input, include_input)

    async def search(
        self, user_id: str, query: str, *, limit: int = 10, min_score: float = 0.0
    ) -> list[ScoredMemory]:
        """See ``Memlane.search``."""
        caller = Caller(user_id=user_id, agent_id=self.agent_id)
        reply = await self.client.search_memories(
            caller=caller, query=query, limit=limit, min_score=min_score
        )
        return list(reply.results)

    async def remember(
        self, user_id: str, content: str, *, kind: MemoryKind.ValueType = MemoryKind.MEMORY_KIND_FACT
    ) -> str:
        """See ``Memlane.remember``."""
        caller = Caller(user_id=user_id, agent_id=self.agent_id)
        reply = await self.client.create_memory(caller=caller, kind=kind, content=content)
        return str(reply.memory.memory_id)

    async def forget_user(self, user_id: str) -> dict[str, int]:
        """See ``Memlane.forget_user``."""
        self._known = _Known()
        return dict((await self.client.forget_user(user_id=user_id)).erased)
