"""Removing a session's messages: by id, the last N ("pop") or all ("clear").

One Lua script (scripts.REMOVE) does the removal, the totals, the summary reset and the idempotency
record atomically. Python reads what is about to go first, for two reasons: the script needs each
message's token count, and a restricted caller may only remove messages it could have written
(``Caller.check_write``, the same rule as an append). For "last N" the ids are the last N at read
time; a message appended between the read and the script is left alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from ..access.identity import UNRESTRICTED, Caller
from ..errors import InvalidArgument
from ..ids import check_id
from ..keyspace import KeySpace
from . import scripts
from .codec import FINGERPRINT_LEN, decode_message
from .model import Message
from .store import SessionStore

MAX_REMOVE = 1000  # ids per call, and N of "last N"
# How long a request id's answer (with the removed messages, for a retried "pop") is kept.
ANSWER_TTL_MS = 3_600_000


@dataclass(slots=True)
class RemoveOutcome:
    removed: list[Message]  # oldest first; empty for "all"
    removed_count: int
    token_total: int
    message_count: int


class MessageRemover:
    def __init__(self, redis: aioredis.Redis, keys: KeySpace, store: SessionStore) -> None:
        self._redis = redis
        self._keys = keys
        self._store = store
        self._remove = redis.register_script(scripts.REMOVE)

    async def remove(
        self,
        session_id: str,
        request_id: str,
        *,
        message_ids: list[str] | None = None,
        last: int = 0,
        everything: bool = False,
        caller: Caller = UNRESTRICTED,
    ) -> RemoveOutcome:
        check_id(session_id, "session_id")
        check_id(request_id, "request_id")
        ids = message_ids or []
        if sum((bool(ids), last != 0, everything)) != 1:
            raise InvalidArgument("set exactly one of message_ids, last and all")
        if last < 0 or last > MAX_REMOVE:
            raise InvalidArgument(f"last must be between 1 and {MAX_REMOVE}")
        if len(ids) > MAX_REMOVE:
            raise InvalidArgument(f"message_ids holds more than {MAX_REMOVE} ids")
        for i, mid in enumerate(ids):
            check_id(mid, f"message_ids[{i}]")
        if everything:
            if not caller.unrestricted:
                async for m in self._store.all_messages(session_id):
                    self._check(caller, m)
            return self._replayable(caller, await self._run(session_id, request_id, "all", []))
        doomed = await self._store.tail(session_id, last) if last else await self._by_ids(session_id, ids)
        for m in doomed:
            self._check(caller, m)
        args: list[Any] = []
        for m in doomed:
            args += [m.message_id, m.token_count]
        return self._replayable(caller, await self._run(session_id, request_id, "ids", args))

    @classmethod
    def _replayable(cls, caller: Caller, out: RemoveOutcome) -> RemoveOutcome:
        """A request id already answered replays its stored answer whatever this call named or which
        mode it asked for: the caller gets it only if it could have removed every message in it (a retry
        by the remover), never another agent's private turns through a guessed or reused request id."""
        for m in out.removed:
            cls._check(caller, m)
        return out

    @staticmethod
    def _check(caller: Caller, m: Message) -> None:
        caller.check_write(
            int(m.visibility), m.source_agent_id, m.visibility_group, f"message {m.message_id!r}"
        )

    async def _by_ids(self, session_id: str, ids: list[str]) -> list[Message]:
        await self._store.get(session_id)  # NOT_FOUND for an unknown session, before anything else
        rows = cast(list[bytes | None], await self._redis.hmget(self._keys.session(session_id).messages, ids))
        return [
            decode_message(session_id, mid, 0, raw)
            for mid, raw in zip(ids, rows, strict=True)
            if raw is not None and len(raw) > FINGERPRINT_LEN
        ]

    async def _run(self, session_id: str, request_id: str, mode: str, pairs: list[Any]) -> RemoveOutcome:
        k = self._keys.session(session_id)
        try:
            out = await self._remove(
                keys=[k.doc, k.messages, k.order, self._keys.removals(session_id), k.traces, k.trace_data],
                args=[request_id, mode, ANSWER_TTL_MS, *pairs],
            )
        except ResponseError as exc:
            raise SessionStore._script_error(exc, session_id) from exc
        flat = out[3]
        removed = [
            decode_message(session_id, flat[i + 1].decode(), int(flat[i]), flat[i + 2])
            for i in range(0, len(flat), 3)
        ]
        removed.sort(key=lambda m: m.seq)
        return RemoveOutcome(removed, int(out[0]), int(out[1]), int(out[2]))
