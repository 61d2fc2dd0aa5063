"""Rewriting Redis's persistence files after an erasure.

A ``DEL`` removes data from memory, not from disk: the append-only file keeps every command that
wrote the user's data until it is rewritten, and an RDB snapshot keeps it until the next save. So
erasure ends by rewriting both (``BGREWRITEAOF``, ``BGSAVE``) and waiting for the rewrite to finish.
An external Redis may forbid these commands (ACLs, renamed commands, managed services): then the
receipt says what the operator must still do instead of claiming what did not happen.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

log = logging.getLogger(__name__)

_POLL_S = 0.05
# INFO persistence fields that say a rewrite or snapshot is running or waiting to run (one blocks the
# other, so wait for both).
_BUSY = ("aof_rewrite_in_progress", "aof_rewrite_scheduled", "rdb_bgsave_in_progress")


@dataclass(slots=True)
class PersistenceReport:
    """What was rewritten ("aof", "rdb") and what the operator must still do (one sentence each)."""

    rewritten: list[str] = field(default_factory=list)
    operator_actions: list[str] = field(default_factory=list)


async def rewrite_persistence(redis: Redis, *, timeout_s: float = 300.0) -> PersistenceReport:
    report = PersistenceReport()
    try:
        info: dict[str, Any] = await redis.info("persistence")
    except ResponseError as exc:
        report.operator_actions.append(
            f"Redis refused INFO ({exc}): rewrite its append-only file (BGREWRITEAOF) and take a new "
            "snapshot (BGSAVE) if it keeps them, so erased data leaves its disk"
        )
        return report
    snapshots = await _keeps_snapshots(redis, report)
    if int(info.get("aof_enabled", 0)):
        await _run(redis, "aof", report, timeout_s)
    if snapshots:
        await _run(redis, "rdb", report, timeout_s)
    if snapshots or (int(info.get("aof_enabled", 0)) and await _rdb_preamble(redis)):
        # RDB encoding copies a stream's nodes as they are, with the entries XDEL marked deleted
        # still inside until every entry of the node is gone (the embedded Redis avoids both).
        report.operator_actions.append(
            "Redis writes RDB-encoded data (snapshots, or aof-use-rdb-preamble yes), which can keep "
            "stream entries deleted by the erasure (events, queue) until their stream node is freed: "
            "set aof-use-rdb-preamble no and disable snapshots, or trim those streams"
        )
    await _note_replicas(redis, report)
    return report


async def _keeps_snapshots(redis: Redis, report: PersistenceReport) -> bool:
    """True when RDB snapshots are configured (``save`` not empty)."""
    try:
        save = (await redis.config_get("save")).get("save", "")
    except ResponseError:
        report.operator_actions.append(
            "Redis refused CONFIG GET save: if it keeps RDB snapshots, take a new one (BGSAVE) so the "
            "erased data leaves its disk"
        )
        return False
    return bool(str(save).strip())


async def _rdb_preamble(redis: Redis) -> bool:
    try:
        return str((await redis.config_get("aof-use-rdb-preamble")).get("aof-use-rdb-preamble")) == "yes"
    except ResponseError:
        return True  # cannot tell: assume the default


async def _run(redis: Redis, kind: str, report: PersistenceReport, timeout_s: float) -> None:
    command = "BGREWRITEAOF" if kind == "aof" else "BGSAVE"
    deadline = time.monotonic() + timeout_s
    try:
        # A rewrite already running started before the erasure: its output may hold the erased data.
        # Wait for it, then start our own and wait for that one.
        while True:
            await _wait_idle(redis, deadline)
            try:
                await (redis.bgrewriteaof() if kind == "aof" else redis.bgsave())
                break
            except ResponseError as exc:
                if "in progress" not in str(exc) and "already" not in str(exc):
                    raise
                await asyncio.sleep(_POLL_S)
        await asyncio.sleep(_POLL_S)
        await _wait_idle(redis, deadline)
        status_key = "aof_last_bgrewrite_status" if kind == "aof" else "rdb_last_bgsave_status"
        status = str((await redis.info("persistence")).get(status_key, "ok"))
        if status != "ok":
            raise ResponseError(f"{command} finished with status {status}")
        report.rewritten.append(kind)
    except (RedisError, TimeoutError) as exc:
        log.warning("redis persistence rewrite failed", extra={"command": command, "error": str(exc)})
        report.operator_actions.append(
            f"{command} did not complete ({exc}): run it on the Redis server (and on its replicas), "
            "so the erased data leaves its " + ("append-only file" if kind == "aof" else "RDB snapshot")
        )


async def _wait_idle(redis: Redis, deadline: float) -> None:
    while True:
        info = await redis.info("persistence")
        if not any(int(info.get(k, 0)) for k in _BUSY):
            return
        if time.monotonic() > deadline:
            raise TimeoutError("Redis is still rewriting its persistence files")
        await asyncio.sleep(_POLL_S)


async def _note_replicas(redis: Redis, report: PersistenceReport) -> None:
    try:
        replicas = int((await redis.info("replication")).get("connected_slaves", 0))
    except ResponseError:
        return
    if replicas:
        report.operator_actions.append(
            f"this Redis has {replicas} replica(s) with persistence files of their own: run BGREWRITEAOF "
            "(and BGSAVE if they keep snapshots) on each"
        )
