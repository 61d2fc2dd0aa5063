"""What the high-level clients (``Memlane``, ``AsyncMemlane``) send and how they read the answers, built
once here so the blocking and the asyncio client cannot drift apart (no I/O here)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from google.protobuf.field_mask_pb2 import FieldMask

from ._chat import ChatMessage
from ._errors import NotFoundError
from .v1.memory_pb2 import (
    Caller,
    ListMemoriesRequest,
    ListMemoryVersionsRequest,
    Memory,
    MemoryFilter,
    MemoryKind,
    UpdateMemoryRequest,
)

_KNOWN_SESSIONS = 10_000  # session ids remembered as created, so add() costs one round trip after the first
PAGE_SIZE = 500  # the most ListMemories and ListMemoryVersions return in one page
DEFAULT_LIMIT = 100  # get_all and history: items returned at most, as mem0's get_all

T = TypeVar("T")


class Known:
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


def context_request(session_id: str, user_input: str, options: Mapping[str, Any]) -> dict[str, Any]:
    return {"session_id": session_id, "user_input": user_input, **options}


def with_input(chat: list[ChatMessage], user_input: str, include: bool) -> list[ChatMessage]:
    """The window ends with the new question, ready to send: the server charged it to the budget. Not
    twice when it was added first (then it is already the session's last turn)."""
    if not include or not user_input:
        return chat
    if chat and chat[-1].get("role") == "user" and chat[-1].get("content") == user_input:
        return chat
    return [*chat, {"role": "user", "content": user_input}]


def no_session(err: NotFoundError, session_id: str) -> NotFoundError:
    """The NOT_FOUND of a context call on a session nobody created, saying how to create it."""
    return NotFoundError(
        f"{err.message}: pass user_id= to context() to create session {session_id!r} for that user "
        "(as add() does), or add() to it first",
        reason=err.reason,
        field_violations=err.field_violations,
        info=err.info,
    )


def list_request(caller: Caller, kinds: Iterable[MemoryKind.ValueType], limit: int) -> ListMemoriesRequest:
    _check_limit(limit)
    return ListMemoriesRequest(
        caller=caller, filter=MemoryFilter(kinds=list(kinds)), page_size=min(limit, PAGE_SIZE)
    )


def history_request(caller: Caller, memory_id: str, limit: int) -> ListMemoryVersionsRequest:
    _check_limit(limit)
    return ListMemoryVersionsRequest(caller=caller, memory_id=memory_id, page_size=min(limit, PAGE_SIZE))


def _check_limit(limit: int) -> None:
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")


def next_page(out: list[T], items: Sequence[T], token: str, request: Any, limit: int) -> bool:
    """Takes one page's items into ``out`` (``limit`` at most); whether there is another page to fetch
    (its token is then set on ``request``)."""
    out.extend(items[: limit - len(out)])
    if not token or len(out) >= limit:
        return False
    request.page_token = token
    return True


def update_request(
    caller: Caller,
    memory_id: str,
    *,
    content: str | None,
    kind: MemoryKind.ValueType | None,
    slot: str | None,
    importance: float | None,
    metadata: Mapping[str, str] | None,
) -> UpdateMemoryRequest:
    """Changes what is given, nothing else; with nothing given the server answers INVALID_ARGUMENT."""
    given: dict[str, Any] = {
        "content": content,
        "kind": kind,
        "slot": slot,
        "importance": importance,
        "metadata": dict(metadata) if metadata is not None else None,
    }
    fields = {name: value for name, value in given.items() if value is not None}
    return UpdateMemoryRequest(
        caller=caller,
        memory=Memory(memory_id=memory_id, **fields),
        update_mask=FieldMask(paths=sorted(fields)),
    )
