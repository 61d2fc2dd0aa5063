"""Once-only marks for client-chosen operation ids: a retried write whose first attempt landed (the
reply was lost) is recognised and not applied again. A mark lives for a day, far longer than any
client's retry window."""

from __future__ import annotations

import redis.asyncio as aioredis

from .ids import check_id
from .keys import KeySpace

MARK_TTL_MS = 24 * 3600 * 1000


class OnceMarks:
    def __init__(self, redis: aioredis.Redis, keys: KeySpace, scope: str) -> None:
        self._redis = redis
        self._keys = keys
        self._scope = scope

    async def claim(self, user_id: str, op_id: str, field: str) -> bool:
        """True the first time ``op_id`` is seen for the user (go ahead), False for a repeat."""
        check_id(user_id, "caller.user_id")
        check_id(op_id, field)
        return bool(await self._redis.set(self._key(user_id, op_id), 1, nx=True, px=MARK_TTL_MS))

    async def release(self, user_id: str, op_id: str) -> None:
        """The operation failed: a retry must run it."""
        await self._redis.delete(self._key(user_id, op_id))

    def _key(self, user_id: str, op_id: str) -> str:
        return self._keys.once(self._scope, user_id, op_id)
