"""The tools: their input schemas (pydantic models, so a model reads a description on every field) and
what each does through memlane's own async client, so the sidecar's access rules, user binding and
limits hold unchanged. No MCP SDK import here: ``_server.py`` puts these on the wire.

Whom a call acts for is never the model's choice when the server was started for one user: the input
models then have no ``user_id`` field and refuse unknown fields, and conversations are checked to belong
to that user before their context is read (AssembleContext names only a session).

The model-facing words are the docs' (docs/integrations.md): a *conversation* (``conversation_id``) is a
memlane session, chosen by the caller; a *memory* is a long-term item; the *profile* is the small set put
into every turn's context.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, create_model

from .._chat import chat_from_context, to_messages
from .._client import AsyncClient
from .._errors import MemlaneError, NotFoundError
from .._json import UNKNOWN, enum_name, enum_names, to_json
from ..v1.context_pb2 import AssembleContextResponse
from ..v1.memory_pb2 import Caller, IngestOutcome, Memory, MemoryFilter, MemoryKind
from ..v1.session_pb2 import Session
from ._options import McpOptions

# The kinds a model names, from the proto enum (MEMORY_KIND_FACT: "fact"; 0 is no kind), so a kind added
# there is offered here with no edit. Typed ``str`` checked at run time against this list, not a
# ``Literal`` (a type checker needs its values written out); the schema lists them as an enum all the same.
_KINDS: dict[str, MemoryKind.ValueType] = enum_names(MemoryKind)
# A kind a newer sidecar stores that this client's proto does not name yet: said so, not guessed.
UNKNOWN_KIND = UNKNOWN
# What a caller may state: every kind but episodes, which the sidecar builds from a conversation's turns.
_STATED_KINDS = [k for k in _KINDS if k != "episodic"]


def _one_of(names: list[str]) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in names:
            raise ValueError(f"kind must be one of {', '.join(names)}; got {value!r}")
        return value

    return check


KindName = Annotated[
    str, AfterValidator(_one_of(list(_KINDS))), WithJsonSchema({"enum": list(_KINDS), "type": "string"})
]
StatedKindName = Annotated[
    str, AfterValidator(_one_of(_STATED_KINDS)), WithJsonSchema({"enum": _STATED_KINDS, "type": "string"})
]
# A memory's kind as answered: a known name, or UNKNOWN_KIND.
_KIND_OUT = [*_KINDS, UNKNOWN_KIND]
KindOut = Annotated[str, WithJsonSchema({"enum": _KIND_OUT, "type": "string"})]
_CONVERSATION_ID = Field(
    min_length=1,
    max_length=128,
    description="Id of the conversation, chosen by you and reused for every turn of it,"
    " e.g. 'chat-2026-12-01-refund'. Letters, digits and - _ . : are safe.",
)
# The sidecar refuses a memory longer than this (memlane_server.ltm.core.MAX_CONTENT_CHARS; a test holds
# the two equal), so the schema says so and a longer one is refused before the sidecar is asked.
MAX_MEMORY_CHARS = 4000


class _Input(BaseModel):
    # Unknown fields are refused, not ignored: a `user_id` slipped into a call of a one-user server
    # fails loudly instead of looking as if it had been obeyed.
    model_config = ConfigDict(extra="forbid")


class ChatTurn(_Input):
    """One message of the conversation."""

    role: Literal["user", "assistant", "system"] = Field(description="Who said it.")
    content: str = Field(min_length=1, description="What was said, as plain text.")
    name: str | None = Field(default=None, max_length=128, description="Speaker's name, if it matters.")


class AddMessages(_Input):
    """Append turns to a conversation (created on first use)."""

    conversation_id: str = _CONVERSATION_ID
    messages: list[ChatTurn] = Field(min_length=1, max_length=100, description="The new turns, in order.")


class GetContext(_Input):
    """The assembled context of a conversation."""

    conversation_id: str = _CONVERSATION_ID
    user_input: str = Field(
        default="",
        description="The user's new message, if any: it is the query that recalls long-term memories.",
    )
    model: str = Field(default="", description="Model name the context is sized for (its tokenizer, window).")
    context_window_tokens: int = Field(
        default=0, ge=0, le=10_000_000, description="Window size in tokens; 0: from the model name."
    )


class SearchMemories(_Input):
    """Recall long-term memories."""

    query: str = Field(min_length=1, description="What to recall, in natural language.")
    limit: int = Field(default=10, ge=1, le=100, description="Most results to return.")
    kinds: list[KindName] = Field(default_factory=list, description="Only these kinds (empty: all).")
    min_score: float = Field(
        default=0.0,
        ge=0.0,
        le=100.0,
        description="Leave out weaker matches: results whose score is below this (0: keep all; a"
        " strong match scores about 0.5 and more, a weak one about 0.3).",
    )


class Remember(_Input):
    """Store one long-term memory."""

    content: str = Field(
        min_length=1,
        max_length=MAX_MEMORY_CHARS,
        description="One self-contained statement about the user, e.g. 'Prefers metric units.'",
    )
    kind: StatedKindName = Field(
        default="fact",
        description="fact: something true about the user; preference: what they like; instruction: a"
        " standing rule for the assistant.",
    )
    slot: str = Field(
        default="",
        max_length=128,
        description="Optional single-valued attribute it sets (e.g. 'home_city'): a newer value replaces"
        " the old one.",
    )


class ForgetMemory(_Input):
    """Delete one long-term memory."""

    memory_id: str = Field(min_length=1, max_length=128, description="Id of the memory, as listed.")


class ListMemories(_Input):
    """List long-term memories, newest first."""

    page_size: int = Field(default=20, ge=1, le=100, description="Memories per page.")
    page_token: str = Field(default="", description="next_page_token of the previous page, if any.")
    kinds: list[KindName] = Field(default_factory=list, description="Only these kinds (empty: all).")


class GetProfile(_Input):
    """The user's profile: the standing instructions, preferences and stable facts."""


_USER_ID = Field(min_length=1, max_length=128, description="Id of the user this call is about.")


# ------------------------------------------------------------------------------ output schemas


class MemoryOut(BaseModel):
    memory_id: str
    kind: KindOut
    content: str
    created_at_unix_ms: int
    slot: str | None = Field(default=None, description="The single-valued attribute it sets, if any.")
    occurred_at_unix_ms: int | None = Field(default=None, description="When it happened (episodes).")
    score: float | None = Field(default=None, description="Relevance to the query (search only).")


class AppendedOut(BaseModel):
    message_id: str
    seq: int = Field(description="Position of the message in the conversation, from 1.")
    token_count: int
    duplicate: bool = Field(description="True when this message id was already stored (a retry).")


class AddMessagesOut(BaseModel):
    conversation_id: str
    results: list[AppendedOut]
    message_count: int = Field(description="Messages in the conversation now.")


class ContextOut(BaseModel):
    text: str = Field(description="The context as labelled text.")
    messages: list[dict[str, Any]] = Field(description="The context as OpenAI chat-format messages.")
    total_tokens: int | None = None
    trace_id: str | None = Field(default=None, description="memlane's trace of this assembly.")


class MemoriesOut(BaseModel):
    memories: list[MemoryOut]


class RememberOut(BaseModel):
    memory_id: str
    outcome: str = Field(description="created, merged (a restatement), superseded (a new slot value), ...")
    superseded_ids: list[str]


class ForgetOut(BaseModel):
    deleted: str = Field(description="Id of the deleted memory.")


class ListOut(BaseModel):
    memories: list[MemoryOut]
    next_page_token: str
    total: int


class ProfileOut(BaseModel):
    instructions: list[MemoryOut]
    preferences: list[MemoryOut]
    facts: list[MemoryOut]


@dataclass(frozen=True)
class Hints:
    """MCP tool annotations. No tool reaches beyond the sidecar, so none is open-world."""

    read_only: bool
    destructive: bool = False
    idempotent: bool = True

    def wire(self, title: str) -> dict[str, Any]:
        return {
            "title": title,
            "readOnlyHint": self.read_only,
            "destructiveHint": self.destructive,
            "idempotentHint": self.idempotent,
            "openWorldHint": False,
        }


READ = Hints(read_only=True)


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    model: type[_Input]
    output: type[BaseModel]
    hints: Hints
    run: Callable[[Any, str], Awaitable[tuple[str, dict[str, Any]]]]  # (input, user) -> (text, data)

    def wire(self) -> dict[str, Any]:
        """The tool as tools/list shows it (MCP's field names), for either SDK line to validate."""
        return {
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "inputSchema": self.model.model_json_schema(),
            "outputSchema": self.output.model_json_schema(),
            "annotations": self.hints.wire(self.title),
        }


class ToolFailure(Exception):
    """A refusal that becomes an MCP tool error; ``data`` is its structured form."""

    def __init__(self, text: str, data: dict[str, Any]) -> None:
        super().__init__(text)
        self.data = data


# The sidecar's request fields that the tools call otherwise: its refusals name the tool's field.
_TOOL_FIELDS = {"session_id": "conversation_id"}


def failure_from(exc: MemlaneError) -> ToolFailure:
    """The sidecar's error, as the model should read it: code, reason, field, message, retry-after."""
    code = exc.code.name
    field = _TOOL_FIELDS.get(exc.field, exc.field)
    message = exc.message.replace("session_id", "conversation_id")
    parts = [p for p in (exc.reason, f"field {field}" if field else "") if p]
    text = f"{code}{' (' + ', '.join(parts) + ')' if parts else ''}: {message}"
    data: dict[str, Any] = {"code": code, "reason": exc.reason, "field": field, "message": message}
    if exc.retry_after is not None:
        data["retry_after_seconds"] = exc.retry_after
        text += f" (retry after {exc.retry_after:g} s)"
    return ToolFailure(text, {"error": data})


# What a tool shows of a memory (MemoryOut), in the one JSON shape of memlane's messages that the CLI
# prints too (memlane/_json.py): the fields a model uses, the required ones even at their defaults.
_MEMORY_REQUIRED: dict[str, Any] = {
    "memory_id": "",
    "kind": UNKNOWN_KIND,
    "content": "",
    "created_at_unix_ms": 0,
}
_MEMORY_OPTIONAL = ("slot", "occurred_at_unix_ms")


def _memory(m: Memory) -> dict[str, Any]:
    full = to_json(m)
    out = {k: full.get(k, default) for k, default in _MEMORY_REQUIRED.items()}
    out.update((k, full[k]) for k in _MEMORY_OPTIONAL if k in full)
    return out


def _lines(memories: list[dict[str, Any]], empty: str) -> str:
    if not memories:
        return empty
    return "\n".join(f"- [{m['kind']}] {m['content']} (id {m['memory_id']})" for m in memories)


class Tools:
    """The tool set of one server: the options fix the agent, the channel and (unless ``any_user``)
    the user."""

    def __init__(self, client: AsyncClient, options: McpOptions) -> None:
        self._client, self._opts = client, options
        self.tools = self._declare()
        self.by_name = {t.name: t for t in self.tools}

    def _caller(self, user_id: str) -> Caller:
        return Caller(user_id=user_id, agent_id=self._opts.agent_id)

    def _model(self, base: type[_Input]) -> type[_Input]:
        if not self._opts.any_user:
            return base
        # With --any-user each tool names its user; the sidecar (and its user token) still decide.
        extended: type[_Input] = create_model(base.__name__, __base__=base, user_id=(str, _USER_ID))
        return extended

    def _declare(self) -> list[Tool]:
        who = "the user" if self._opts.any_user else f"user {self._opts.user_id!r}"
        return [
            Tool(
                "add_messages",
                "Add messages to a conversation",
                f"Append turns to a conversation of {who}, creating the conversation on first use. Record"
                " each user message and your reply so later turns (and other sessions) can use them.",
                self._model(AddMessages),
                AddMessagesOut,
                # Each call stores new messages (new ids): twice is two turns, so not idempotent.
                Hints(read_only=False, idempotent=False),
                self._add_messages,
            ),
            Tool(
                "get_context",
                "Get a conversation's context",
                f"The context memlane assembled for a conversation of {who}: profile, recalled long-term"
                " memories, summary and recent turns, as text and as chat messages, within a token budget.",
                self._model(GetContext),
                ContextOut,
                READ,
                self._get_context,
            ),
            Tool(
                "search_memories",
                "Search memories",
                f"Search the long-term memories of {who} (facts, preferences, instructions, past"
                " episodes), best match first.",
                self._model(SearchMemories),
                MemoriesOut,
                READ,
                self._search,
            ),
            Tool(
                "remember",
                "Remember a fact about the user",
                f"Store one durable fact, preference or instruction about {who}. A restatement merges into"
                " the existing memory; a new value for the same slot replaces the old one.",
                self._model(Remember),
                RememberOut,
                # A restatement merges into the memory it repeats; a replaced slot value stays in the
                # memory's history (ListMemoryVersions), so nothing is lost.
                Hints(read_only=False),
                self._remember,
            ),
            Tool(
                "forget_memory",
                "Forget a memory",
                f"Delete one long-term memory of {who} by id (from search_memories or list_memories).",
                self._model(ForgetMemory),
                ForgetOut,
                Hints(read_only=False, destructive=True),
                self._forget,
            ),
            Tool(
                "list_memories",
                "List memories",
                f"List the long-term memories of {who}, newest first, a page at a time.",
                self._model(ListMemories),
                ListOut,
                READ,
                self._list,
            ),
            Tool(
                "get_profile",
                "Get the user's profile",
                f"The profile of {who}: standing instructions, preferences and stable facts, the small set"
                " memlane puts into every turn's context.",
                self._model(GetProfile),
                ProfileOut,
                READ,
                self._profile,
            ),
        ]

    def user_of(self, args: BaseModel) -> str:
        return str(getattr(args, "user_id", "")) if self._opts.any_user else self._opts.user_id

    async def call(self, name: str, arguments: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """Runs one tool; raises ToolFailure (unknown tool, bad input, the sidecar's refusal)."""
        tool = self.by_name.get(name)
        if tool is None:
            raise ToolFailure(f"unknown tool {name!r}", {"error": {"code": "NOT_FOUND", "reason": "NO_TOOL"}})
        try:
            args = tool.model.model_validate(dict(arguments))
        except ValueError as exc:
            raise ToolFailure(
                f"INVALID_ARGUMENT: {exc}", {"error": {"code": "INVALID_ARGUMENT", "reason": "BAD_INPUT"}}
            ) from None
        return await self.run(name, args, self.user_of(args))

    async def run(self, name: str, args: BaseModel, user: str) -> tuple[str, dict[str, Any]]:
        """Runs tool ``name`` on validated input for ``user`` (resources and prompts use this too)."""
        try:
            return await self.by_name[name].run(args, user)
        except MemlaneError as exc:
            raise failure_from(exc) from None

    # ---------------------------------------------------------------------------------------- tools

    async def _add_messages(self, args: AddMessages, user: str) -> tuple[str, dict[str, Any]]:
        # CreateSession returns the user's existing session and refuses (ALREADY_EXISTS) an id that is
        # another user's, so appending never lands in someone else's conversation.
        await self._client.create_session(
            session_id=args.conversation_id,
            user_id=user,
            agent_id=self._opts.agent_id,
            channel=self._opts.channel,
        )
        turns = [t.model_dump(exclude_none=True) for t in args.messages]
        reply = await self._client.append_messages(
            session_id=args.conversation_id, messages=to_messages(turns, self._opts.agent_id)
        )
        results = [
            {"message_id": r.message_id, "seq": r.seq, "token_count": r.token_count, "duplicate": r.duplicate}
            for r in reply.results
        ]
        data = {
            "conversation_id": args.conversation_id,
            "results": results,
            "message_count": reply.message_count,
        }
        return f"stored {len(results)} message(s) in {args.conversation_id}", data

    async def owned_session(self, conversation_id: str, user: str) -> Session:
        """The conversation, if it is this user's. One that is not is refused with the same answer as a
        missing one: nothing of another user's conversation (its user, its status, its size) comes back.
        That an id is taken is visible anyway, as CreateSession's ALREADY_EXISTS is to any caller."""
        try:
            session = (await self._client.get_session(session_id=conversation_id)).session
        except NotFoundError:
            session = None
        except MemlaneError as exc:  # a bad id, the sidecar unavailable: its refusal, in the tools' words
            raise failure_from(exc) from None
        if session is None or session.user_id != user:
            raise ToolFailure(
                f"NOT_FOUND (SESSION_NOT_FOUND): no conversation {conversation_id!r} of this user",
                {"error": {"code": "NOT_FOUND", "reason": "SESSION_NOT_FOUND", "field": "conversation_id"}},
            )
        return session

    async def _get_context(self, args: GetContext, user: str) -> tuple[str, dict[str, Any]]:
        await self.owned_session(args.conversation_id, user)
        stream = self._client.assemble_context(
            session_id=args.conversation_id,
            user_input=args.user_input,
            model=args.model,
            context_window_tokens=args.context_window_tokens,
            render_text=True,
        )
        responses: list[AssembleContextResponse] = [r async for r in stream]
        text = "\n\n".join(b.rendered_text for r in responses for b in r.blocks if b.rendered_text)
        stats = next((r.stats for r in responses if r.HasField("stats")), None)
        data: dict[str, Any] = {"text": text, "messages": chat_from_context(responses)}
        if stats is not None:
            data["total_tokens"], data["trace_id"] = stats.total_tokens, stats.trace_id
        return text or "(empty context)", data

    async def _search(self, args: SearchMemories, user: str) -> tuple[str, dict[str, Any]]:
        reply = await self._client.search_memories(
            caller=self._caller(user),
            query=args.query,
            limit=args.limit,
            filter=MemoryFilter(kinds=[_KINDS[k] for k in args.kinds]),
            min_score=args.min_score,
        )
        found = [{**_memory(r.memory), "score": round(r.score, 4)} for r in reply.results]
        return _lines(found, "no memory matches"), {"memories": found}

    async def _remember(self, args: Remember, user: str) -> tuple[str, dict[str, Any]]:
        # The sidecar chooses the id (mem_...), as for every other client: a memory has one id shape. A
        # retry is still safe without an id of ours: the client sends a CreateMemory without one only
        # once, and the model's own retry of this call (the same text, by the same agent, for the same
        # user) merges into the memory the first call stored (outcome "merged", the same memory_id).
        reply = await self._client.create_memory(
            caller=self._caller(user),
            kind=_KINDS[args.kind],
            content=args.content,
            slot=args.slot,
            channel=self._opts.channel,
        )
        name = enum_name(IngestOutcome.DESCRIPTOR, reply.outcome)  # created, merged, superseded...
        data = {
            "memory_id": reply.memory.memory_id,
            "outcome": name,
            "superseded_ids": list(reply.superseded_ids),
        }
        return f"{name}: memory {reply.memory.memory_id}", data

    async def _forget(self, args: ForgetMemory, user: str) -> tuple[str, dict[str, Any]]:
        await self._client.delete_memory(caller=self._caller(user), memory_id=args.memory_id)
        return f"deleted memory {args.memory_id}", {"deleted": args.memory_id}

    async def _list(self, args: ListMemories, user: str) -> tuple[str, dict[str, Any]]:
        reply = await self._client.list_memories(
            caller=self._caller(user),
            filter=MemoryFilter(kinds=[_KINDS[k] for k in args.kinds]),
            page_size=args.page_size,
            page_token=args.page_token,
        )
        listed = [_memory(m) for m in reply.memories]
        data = {"memories": listed, "next_page_token": reply.next_page_token, "total": reply.total_size}
        more = f"\n(more: page_token {reply.next_page_token!r})" if reply.next_page_token else ""
        return _lines(listed, "no memories") + more, data

    async def _profile(self, args: GetProfile, user: str) -> tuple[str, dict[str, Any]]:
        reply = await self._client.get_profile(caller=self._caller(user))
        data = {
            "instructions": [_memory(m) for m in reply.instructions],
            "preferences": [_memory(m) for m in reply.preferences],
            "facts": [_memory(m) for m in reply.facts],
        }
        text = "\n".join(f"{k}:\n{_lines(v, '  (none)')}" for k, v in data.items())
        return text, data
