"""What every part of the session store shares: the client, the registered scripts, the append path's
memo (``append_memo.py``, its own state's one owner), reading a session document, and the mapping of
script errors to the API's errors (sessions/store.py assembles the parts)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from ..errors import AlreadyExists, Conflict, FailedPrecondition, NotFound, SessionExpired
from ..ids import check_id
from ..infra.redis_lane import as_dict, hot
from ..keyspace import KeySpace
from ..tokens import TokenCounter
from . import scripts
from .append_memo import AppendMemo
from .codec import decode_session
from .events import OutboxWriter
from .limits import Limits
from .model import (
    Session,
    SessionStatus,
    Topology,
)
from .scripts import Durability


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# A filtered listing reads at most this many messages per call and then returns a (maybe short) page.
_SCAN_BUDGET = 5_000


class StoreBase:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: KeySpace,
        tokens: TokenCounter,
        *,
        limits: Limits,
        default_ttl_seconds: int,
        default_topology: Topology = Topology.SHARED,
        executor: Executor | None = None,
        durability: Durability | None = None,
    ) -> None:
        self.redis = redis
        self._durability = durability if durability is not None and durability.replicas > 0 else None
        self.keys = keys
        self.tokens = tokens
        self.limits = limits
        self.default_ttl_seconds = default_ttl_seconds
        self.default_topology = default_topology
        self._executor = executor
        # redis-py leaves execute_command untyped; this is the bare, cheapest way to send one command.
        self._command = cast(Callable[..., Awaitable[Any]], redis.execute_command)
        # The only state the parts share that changes after construction; its owner changes it.
        self._memo = AppendMemo(redis, keys)
        self._append = redis.register_script(scripts.APPEND)
        self._read = redis.register_script(scripts.READ_RANGE)
        self._transition = redis.register_script(scripts.TRANSITION)
        self._set_summary = redis.register_script(scripts.SET_SUMMARY)
        self._set_promotion = redis.register_script(scripts.SET_PROMOTION)
        self._create = redis.register_script(scripts.CREATE)
        self._retire = redis.register_script(scripts.RETIRE)
        self._set_lifecycle = redis.register_script(scripts.SET_LIFECYCLE)
        self._outbox = OutboxWriter(redis, keys)

    async def _hot(self, *command: Any) -> Any:
        """One command of a hot path through the client's pipelined lane (``infra/redis_lane.py``)."""
        return await hot(self.redis, *command)

    async def get(self, session_id: str) -> Session:
        check_id(session_id, "session_id")
        h = as_dict(await self._hot("HGETALL", self.keys.session(session_id).doc))
        if not h:
            raise NotFound(f"session {session_id!r} not found")
        return decode_session(h)

    async def get_many(self, session_ids: Sequence[str]) -> list[Session | None]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in session_ids:
                pipe.hgetall(self.keys.session(sid).doc)
            rows = await pipe.execute()
        return [decode_session(h) if h else None for h in rows]

    @staticmethod
    def _script_error(exc: ResponseError, session_id: str) -> Exception:
        msg = str(exc)
        word = msg.split(" ", 1)[0]
        if word == "NOTFOUND":
            return NotFound(f"session {session_id!r} not found")
        if word == "CLOSED":
            return FailedPrecondition(f"session {session_id!r} is closed; start a new session")
        if word == "EXPIRED":
            return SessionExpired(f"session {session_id!r} has expired; resume it first")
        if word == "CONFLICT":
            mid = msg.split(" ")[1] if " " in msg else "?"
            return AlreadyExists(
                f"message_id {mid!r} already exists in session {session_id!r} with different content"
            )
        if word == "ILLEGAL":
            cur = msg.split(" ")[1] if " " in msg else "?"
            try:
                name = SessionStatus(int(cur)).name.lower()
            except ValueError:
                name = cur
            return FailedPrecondition(f"session {session_id!r} is {name}; that transition is not allowed")
        if word == "ALIVE":
            return Conflict(f"session {session_id!r} was active again before it could expire")
        if word == "STALE":
            return Conflict(f"summary of session {session_id!r} changed since it was read; re-read and retry")
        return exc
