"""What long-term memory keeps in Redis beside its LanceDB table, all of it per user: the versions and
snapshots of users' memory items (``RedisMemoryHistory``, ``ltm/history.py``'s backends: the item
documents arrive encoded and leave as stored, so this part knows no memory item), the version tokens that
tell a reader its view is stale (``LtmVersions``, read by ``freshness.py``), and the once-only marks of
client-chosen operation ids (``OnceMarks``, e.g. memory feedback). The sections below say why each is
in Redis.

Why Redis for the versions and snapshots: both are per-user and must go when the user goes. Under
``KeySpace.memory_versions`` (a STREAM per user, trimmed to ``ltm_versions_max_per_user``),
``memory_snapshots`` (a ZSET of names) and ``memory_snapshot`` (a HASH per snapshot) they are per-user
keys, which ForgetUser's scan of the user's keys deletes and whose bytes the append-only-file rewrite then
drops (the raw-bytes erasure test checks it). LanceDB would have meant a second table to erase byte for
byte, and a table version per change.

Snapshots store items without vectors (about 1 KB an item instead of 2.5 KB); a restore re-embeds only
items whose text changed since.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import redis.asyncio as aioredis
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from ..errors import AlreadyExists, InvalidArgument, ResourceExhausted
from ..ids import check_id
from ..infra.redis_lane import hot
from ..keyspace import KeySpace

META_FIELD = "\0meta"
_WRITE_CHUNK = 500

# KEYS: the user's snapshot index.  ARGV: snapshot id, created at (ms), the per-user limit.
# 1 reserved; -1 the name is taken; -2 the user has as many snapshots as allowed.
RESERVE = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return -1 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return -2 end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
return 1
"""


class JournalEntry(NamedTuple):
    """One stored version: where it stands in the user's journal, and its fields."""

    cursor: str  # the stream entry id (a page token)
    memory_id: str
    reason: int
    actor: str
    at_ms: int
    deleted: bool
    item: bytes  # the item document as ``ltm.history.item_bytes`` wrote it


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisMemoryHistory:
    def __init__(self, redis: Redis, keys: KeySpace, *, max_versions: int, max_snapshots: int) -> None:
        self._redis = redis
        self._keys = keys
        self._max_versions = max_versions
        self._max_snapshots = max_snapshots
        self._reserve = redis.register_script(RESERVE)

    # --- versions (ltm.history.JournalBackend)

    async def append(self, user_id: str, actor: str, entries: Sequence[tuple[str, int, bool, bytes]]) -> None:
        """Journals (memory id, reason, deleted, item document) rows, oldest first."""
        if not entries or self._max_versions <= 0:
            return
        stream = self._keys.memory_versions(user_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            for memory_id, reason, deleted, item in entries:
                fields = _entry_fields(memory_id, reason, actor, deleted, item)
                pipe.xadd(stream, fields, maxlen=self._max_versions, approximate=True)
            await pipe.execute()

    async def import_entries(
        self, user_id: str, rows: Sequence[tuple[str, int, str, int, bool, bytes]]
    ) -> int:
        """Journals versions read from an export (ImportUserData) at the times they were made, oldest
        first; a version the journal holds already (same item, time, reason, author) is left out, so an
        import run twice journals nothing the second time. Returns how many were written. A version older
        than the journal's newest entry (an import merged into a user with history here) is journaled
        now, its own time kept beside it (``t``), which is the time it is read back with."""
        if self._max_versions <= 0 or not rows:
            return 0
        stream = self._keys.memory_versions(user_id)
        held: set[tuple[str, int, int, str]] = set()
        after = ""
        while True:
            page, after = await self.entries(user_id, "", after, 500)
            held |= {(e.memory_id, e.at_ms, e.reason, e.actor) for e in page}
            if not after:
                break
        written = 0
        for memory_id, reason, actor, at_ms, deleted, item in sorted(rows, key=lambda r: r[3]):
            if (memory_id, at_ms, reason, actor) in held:
                continue
            fields = _entry_fields(memory_id, reason, actor, deleted, item)
            if at_ms < 1:
                fields["t"] = at_ms  # stream ids start at 1 ms
            try:
                await self._redis.xadd(stream, fields, id=f"{max(at_ms, 1)}-*", maxlen=self._max_versions)
            except ResponseError:  # older than the newest entry: streams only grow
                fields["t"] = at_ms
                await self._redis.xadd(stream, fields, maxlen=self._max_versions, approximate=True)
            written += 1
        return written

    async def entries(
        self, user_id: str, memory_id: str, after: str, limit: int
    ) -> tuple[list[JournalEntry], str]:
        """Oldest first, from after the cursor ``after`` (of ``memory_id`` only, unless empty); (page,
        cursor of the next page or "")."""
        stream = self._keys.memory_versions(user_id)
        start = f"({after}" if after else "-"
        out: list[JournalEntry] = []
        while len(out) <= limit:
            try:
                batch: Any = await self._redis.xrange(stream, min=start, max="+", count=500)
            except ResponseError as exc:  # a cursor that is no stream id: the caller's token was edited
                raise InvalidArgument("page_token is not valid") from exc
            if not batch:
                break
            for entry_id, raw in batch:
                start = f"({_s(entry_id)}"
                f = {_s(k): v for k, v in raw.items()}
                if memory_id and _s(f["m"]) != memory_id:
                    continue
                out.append(_entry(_s(entry_id), f))
        page = out[:limit]
        return page, (page[-1].cursor if len(out) > limit else "")

    # --- snapshots (SnapshotBackend)

    @property
    def max_snapshots(self) -> int:
        return self._max_snapshots

    async def reserve(self, user_id: str, snapshot_id: str, created_at_ms: int) -> None:
        index = self._keys.memory_snapshots(user_id)
        got = int(await self._reserve(keys=[index], args=[snapshot_id, created_at_ms, self._max_snapshots]))
        if got == -1:
            raise AlreadyExists(f"snapshot {snapshot_id!r} already exists")
        if got == -2:
            raise ResourceExhausted(
                f"this user already has {self._max_snapshots} snapshots; delete one first"
            )

    async def write(self, user_id: str, snapshot_id: str, meta: bytes, items: dict[str, bytes]) -> None:
        """Items in chunks, the description last: a snapshot without it is incomplete, never served."""
        key = self._keys.memory_snapshot(user_id, snapshot_id)
        pairs = list(items.items())
        for start in range(0, len(pairs), _WRITE_CHUNK):
            await self._redis.hset(key, mapping=dict(pairs[start : start + _WRITE_CHUNK]))
        await self._redis.hset(key, META_FIELD, meta)

    async def meta(self, user_id: str, snapshot_id: str) -> bytes | None:
        raw: Any = await self._redis.hget(self._keys.memory_snapshot(user_id, snapshot_id), META_FIELD)
        return bytes(raw) if raw is not None else None

    async def items(self, user_id: str, snapshot_id: str) -> dict[str, bytes]:
        raw: Any = await self._redis.hgetall(self._keys.memory_snapshot(user_id, snapshot_id))
        return {_s(k): bytes(v) for k, v in raw.items() if _s(k) != META_FIELD}

    async def metas(self, user_id: str) -> list[bytes]:
        ids: Any = await self._redis.zrevrange(self._keys.memory_snapshots(user_id), 0, -1)
        if not ids:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for sid in ids:
                pipe.hget(self._keys.memory_snapshot(user_id, _s(sid)), META_FIELD)
            found: list[Any] = await pipe.execute()
        return [bytes(m) for m in found if m is not None]

    async def delete(self, user_id: str, snapshot_id: str) -> bool:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.delete(self._keys.memory_snapshot(user_id, snapshot_id))
            pipe.zrem(self._keys.memory_snapshots(user_id), snapshot_id)
            deleted, removed = await pipe.execute()
        return bool(deleted or removed)

    # --- erasure needs nothing here: these are per-user keys (see the module docstring)

    async def sizes(self, user_id: str) -> dict[str, int]:
        """What erasure will remove, for its receipt."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xlen(self._keys.memory_versions(user_id))
            pipe.zcard(self._keys.memory_snapshots(user_id))
            versions, snapshots = await pipe.execute()
        return {"redis.memory_versions": int(versions), "redis.memory_snapshots": int(snapshots)}


def _entry_fields(memory_id: str, reason: int, actor: str, deleted: bool, item: bytes) -> dict[Any, Any]:
    """One version as a stream entry holds it (``_entry`` reads it back)."""
    return {"m": memory_id, "r": reason, "a": actor, "d": b"1" if deleted else b"", "i": item}


def _entry(entry_id: str, f: dict[str, Any]) -> JournalEntry:
    return JournalEntry(
        cursor=entry_id,
        memory_id=_s(f["m"]),
        reason=int(f["r"]),
        actor=_s(f["a"]),
        # An imported version journaled after newer ones carries its own time (import_entries).
        at_ms=int(f["t"]) if "t" in f else int(entry_id.split("-", 1)[0]),
        deleted=bool(f.get("d")),
        item=bytes(f["i"]),
    )


# ---------------------------------------------------------------- the user's version tokens
# A per-user version of long-term memory, kept in Redis so every sidecar sharing the stores sees it. The LTM
# service bumps it after each write that changes what a user's reads return (create, merge, supersede,
# update, delete, feedback, pruning, erasure). Assembly reads it before using anything cached about the
# user: a cached profile made at another version is stale, and so is this sidecar's LanceDB handle (it does
# not see other processes' writes until refreshed).

log = logging.getLogger("memlane.context")

# A version is a fresh random token, never a counter, and never "absent": a reader that finds no key
# (expired, or deleted by erasure, since its name holds the user id) claims a fresh token first. So a
# version some sidecar remembered can never come back, and the next assembly after any change or
# erasure sees a new one. The TTL only tidies up users nobody reads.
VERSION_TTL_S = 86_400


class LtmVersions:
    def __init__(self, redis: aioredis.Redis, keys: KeySpace) -> None:
        self._redis = redis
        self._keys = keys

    async def bump(self, user_id: str, removed: bool = False, learnt: bool = False) -> None:
        """After a write; ``removed``: it deleted rows (a delete, pruning, erasure, a restore), which a
        reader cannot see in what changed since its view and must reload for; ``learnt``: learning made
        it (an open session's promotion), which no caller waits to read, so readers take it in behind their
        reads (ltm/core.py ``Freshness``). A failure is logged, not raised: the write itself landed, and
        cached profiles expire within seconds anyway (a Redis that is down fails the next assembly
        first)."""
        token = os.urandom(12)
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                if learnt and not removed:
                    pipe.set(self._keys.ltm_learnt(user_id), token, ex=VERSION_TTL_S)
                else:
                    pipe.set(self._keys.ltm_version(user_id), token, ex=VERSION_TTL_S)
                if removed:
                    pipe.set(self._keys.ltm_removals(user_id), token, ex=VERSION_TTL_S)
                await pipe.execute()
        except RedisError as exc:
            log.warning("ltm version bump failed", extra={"detail": str(exc)})

    async def read(self, user_id: str) -> tuple[bytes, bytes, bytes]:
        """The user's current version, removals and learnt tokens (one MGET; three more round trips only
        when the version is missing). A missing version (erased with the user, or expired) counts as a
        removal too: the fresh version it is replaced by becomes the removals token as well, so no
        reader catches up across an erasure."""
        key, removals = self._keys.ltm_version(user_id), self._keys.ltm_removals(user_id)
        learnt = self._keys.ltm_learnt(user_id)
        raw, gone, taught = cast(
            list[bytes | None], await hot(self._redis, "MGET", key, removals, learnt)
        )  # per assembly
        if raw is None:
            await self._redis.set(key, os.urandom(12), ex=VERSION_TTL_S, nx=True)
            raw = cast(bytes | None, await self._redis.get(key)) or b""
            await self._redis.set(removals, raw, ex=VERSION_TTL_S)  # racers read and write the same
            gone = raw
        return raw, gone or b"", taught or b""


# ---------------------------------------------------------------- once-only marks
# Once-only marks for client-chosen operation ids: a retried write whose first attempt landed (the reply was
# lost) is recognised and not applied again. A mark lives for a day, far longer than any client's retry
# window.

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
