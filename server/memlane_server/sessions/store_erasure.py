"""The session store's per-user export and erasure: every Redis key of a user's sessions, the index
entries and stream entries that name them."""

from __future__ import annotations

from typing import Any, cast

from ..infra.redis_server import PersistenceReport, rewrite_persistence
from .ids import check_id
from .outbox import decode_entry
from .store_base import StoreBase


class ErasureOps(StoreBase):
    async def session_ids_of_user(self, user_id: str) -> list[str]:
        check_id(user_id, "user_id")
        raw = cast(list[bytes], await self.redis.zrange(self.keys.user_sessions(user_id), 0, -1))
        return [r.decode() for r in raw]

    async def erase_user(self, user_id: str) -> dict[str, int]:
        """Deletes every Redis key of the user's sessions (document, messages, order, activity, traces)
        and the user's entries in every index. Returns counts by kind. Idempotent."""
        sids = await self.session_ids_of_user(user_id)
        counts = {"redis.sessions": 0, "redis.messages": 0, "redis.traces": 0}
        for i in range(0, len(sids), 200):
            chunk = sids[i : i + 200]
            async with self.redis.pipeline(transaction=False) as pipe:
                for sid in chunk:
                    k = self.keys.session(sid)
                    pipe.exists(k.doc)
                    pipe.hlen(k.messages)
                    pipe.zcard(k.traces)
                sizes = await pipe.execute()
            async with self.redis.pipeline(transaction=False) as pipe:
                for sid in chunk:
                    pipe.delete(*self.keys.every_key_of(sid))
                for index in self.keys.session_indexes():
                    pipe.zrem(index, *chunk)
                await pipe.execute()
            for j, sid in enumerate(chunk):
                counts["redis.sessions"] += int(sizes[3 * j])
                counts["redis.messages"] += int(sizes[3 * j + 1])
                counts["redis.traces"] += int(sizes[3 * j + 2])
                self._memo.forget(sid)
        # Every per-user key (sessions index, LTM version, retry once-marks): their names hold the id.
        per_user = [k async for k in self.redis.scan_iter(match=self.keys.user_pattern(user_id), count=1000)]
        for i in range(0, len(per_user), 500):
            await self.redis.delete(*per_user[i : i + 500])
        marks = self.keys.once_prefix(user_id).encode()
        counts["redis.once_marks"] = sum(1 for k in per_user if k.startswith(marks))
        counts["redis.stream_entries"] = await self._erase_stream_entries(set(sids), user_id)
        counts["redis.stream_entries"] += await self._erase_queued_events(set(sids), user_id)
        return counts

    async def _erase_queued_events(self, session_ids: set[str], user_id: str) -> int:
        """Events of the session-end queue not yet relayed to the stream (sessions/outbox.py) that name
        one of the sessions or the user; the sessions' own outboxes went with their keys."""
        key = self.keys.session_end_outbox()
        rows: Any = await self.redis.lrange(key, 0, -1)
        erased = 0
        for raw in rows:
            entry = decode_entry(raw)
            if entry["s"] in session_ids or entry["u"] == user_id:
                erased += int(await self.redis.lrem(key, 0, raw))
        return erased

    async def rewrite_persistence(self) -> PersistenceReport:
        """After an erasure: Redis's files on disk still hold what the deletes removed from memory."""
        return await rewrite_persistence(self.redis)

    async def _erase_stream_entries(self, session_ids: set[str], user_id: str) -> int:
        """XDELs every event and queued job that names one of the sessions (or the user)."""
        erased = 0
        for stream in self.keys.session_streams():
            start = "-"
            while True:
                batch = cast(
                    list[tuple[bytes, dict[bytes, bytes]]],
                    await self.redis.xrange(stream, min=start, max="+", count=1000),
                )
                doomed = [
                    eid
                    for eid, fields in batch
                    if fields.get(b"s", b"").decode() in session_ids
                    or fields.get(b"u", b"").decode() == user_id
                ]
                if doomed:
                    erased += int(await self.redis.xdel(stream, *doomed))
                if len(batch) < 1000:
                    break
                start = "(" + batch[-1][0].decode()
        return erased
