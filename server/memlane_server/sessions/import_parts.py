"""The parts of an import file too large for one call (ImportUserData with ``upload_id``), held in
Redis until the last part arrives; then the file is checked and imported whole, as one call would.

Held under the user's keys (``KeySpace.import_parts``): erasing the user erases what was sent, and the
parts of one user's upload can never be read into another's. A part sent again (a retried call)
replaces itself; parts left behind by a client that gave up expire after ``TTL_S``. A file is at most
``MAX_FILE_BYTES`` however it is sent.
"""

from __future__ import annotations

from typing import Any

from redis import asyncio as aioredis

from ..errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from ..keyspace import KeySpace

TTL_S = 3600
MAX_PARTS = 1024
MAX_FILE_BYTES = 1 << 30


class ImportParts:
    def __init__(self, redis: aioredis.Redis, keys: KeySpace) -> None:
        self._redis = redis
        self._keys = keys

    async def hold(self, user_id: str, upload_id: str, part: int, data: bytes) -> None:
        """Keeps one part (the first whole, header included; the others without their header line)."""
        if not 0 <= part < MAX_PARTS:
            raise InvalidArgument(f"part must be from 0 to {MAX_PARTS - 1}", field="part")
        key = self._keys.import_parts(user_id, upload_id)
        if data and not data.endswith(b"\n"):
            data += b"\n"  # parts are whole lines: the next part's first line starts a line of its own
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, str(part), data)
            pipe.expire(key, TTL_S)
            pipe.hkeys(key)
            *_, names = await pipe.execute()
        async with self._redis.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hstrlen(key, name)
            total = sum(int(n) for n in await pipe.execute())
        if total > MAX_FILE_BYTES:
            await self._redis.delete(key)
            raise ResourceExhausted(
                f"the upload's parts hold {total} bytes; an import file is at most {MAX_FILE_BYTES}",
                field="data",
            )

    async def take(self, user_id: str, upload_id: str, last: int) -> bytes:
        """The file: parts 0 to ``last`` joined; they are no longer held afterwards. FailedPrecondition
        when a part is missing (never sent, or expired): the upload must be sent again."""
        key = self._keys.import_parts(user_id, upload_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(key)
            pipe.delete(key)
            held, _ = await pipe.execute()
        parts: dict[int, Any] = {int(k): v for k, v in held.items()}
        missing = [i for i in range(last + 1) if i not in parts]
        if missing or len(parts) != last + 1:
            raise FailedPrecondition(
                f"upload {upload_id!r} lacks part {missing[0] if missing else last + 1} of {last + 1}"
                f" (never sent, or held longer than {TTL_S} s): send the file again"
            )
        return b"".join(bytes(parts[i]) for i in range(last + 1))
