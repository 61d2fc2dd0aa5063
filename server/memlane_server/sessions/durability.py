"""Replica acknowledgement for acknowledged writes (``redis_wait_replicas``).

Redis replicates asynchronously: a master that dies right after answering may take the last writes with
it, and its promoted replica never saw them. With ``replicas > 0`` a write script is followed by ``WAIT
replicas timeout`` **on the same connection** (WAIT counts the replication offset of that connection's
writes, so it must share the pipeline; on Redis Cluster both commands go to the node owning the session's
slot). If fewer replicas confirm within the timeout the write is reported UNAVAILABLE: it happened on the
master and may or may not survive a failover, and a retry with the same message ids is idempotent.
Replication is in order, so a later confirmed write also confirms every earlier one on that master.

On Redis Cluster every failure of a durable write also refreshes the client's slot map (at most once per
``_REFRESH_EVERY_S``): after a failover the map may still name the old master, which came back as a
replica, so the EVALSHA is redirected to the new master while the WAIT, sent to the node the map named,
counts a replica's confirmations: without a refresh every retry met the same stale map (durable appends
answered UNAVAILABLE for a minute once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from ..errors import Unavailable

log = logging.getLogger("memlane")


_REFRESH_EVERY_S = 0.5
# Replies that say the slot map is wrong or changing (the script's own refusals, NOTFOUND and the like,
# say nothing about the topology).
_TOPOLOGY_REPLIES = ("MOVED", "ASK", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS", "LOADING")


def _topology(exc: BaseException) -> bool:
    if isinstance(exc, NoScriptError):
        return False
    if isinstance(exc, ResponseError):
        return str(exc).startswith(_TOPOLOGY_REPLIES)
    return True  # ours (too few replicas, the slot moved), a lost connection, a timeout, a cluster error


@dataclass(frozen=True, slots=True)
class Durability:
    # From the settings redis_wait_replicas and redis_wait_timeout_ms (wiring/), which hold the defaults.
    replicas: int  # 0: answer as soon as the master has the write (Redis's default)
    timeout_ms: int
    _refreshed_at: list[float] = field(default_factory=lambda: [0.0], compare=False, repr=False)

    async def evalsha(
        self, redis: aioredis.Redis, script: str, sha: str, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        """EVALSHA, then WAIT when replicas are asked for; loads the script on NOSCRIPT (nothing ran)."""
        for attempt in (0, 1):
            try:
                return await self._once(redis, sha, keys, args)
            except NoScriptError:
                if attempt:
                    raise
                await redis.script_load(script)
        raise AssertionError("unreachable")

    async def _once(self, redis: aioredis.Redis, sha: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if not isinstance(redis, RedisCluster):
            return await self._confirmed(redis, None, sha, keys, args)
        try:
            return await self._confirmed(redis, redis, sha, keys, args)
        except Exception as exc:
            if _topology(exc):
                await self._refresh(redis)
            raise

    async def _refresh(self, cluster: RedisCluster) -> None:
        """Re-reads the slot map (nodes and roles) from the cluster, unless done a moment ago."""
        now = time.monotonic()
        if now - self._refreshed_at[0] < _REFRESH_EVERY_S:
            return
        self._refreshed_at[0] = now
        try:
            await cluster.nodes_manager.initialize()
        except Exception:  # the cluster is still electing: the next failure asks again
            log.warning("could not refresh the Redis Cluster slot map", exc_info=True)

    async def _confirmed(
        self,
        redis: aioredis.Redis,
        cluster: RedisCluster | None,
        sha: str,
        keys: Sequence[str],
        args: Sequence[Any],
    ) -> Any:
        node: Any = None
        target: dict[str, Any] = {}
        if cluster is not None:
            node = cluster.get_node_from_key(keys[0])
            target["target_nodes"] = node
        async with redis.pipeline(transaction=False) as pipe:
            pipe.execute_command("EVALSHA", sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", self.replicas, self.timeout_ms, **target)
            # Unannotated errors: the store maps the script's own error words (NOTFOUND, CONFLICT ...).
            out, acked = await pipe.execute(raise_on_error=False)
        if isinstance(out, Exception):
            raise out
        if cluster is not None and cluster.get_node_from_key(keys[0]) is not node:
            # The slot moved mid-pipeline (failover): the script was redirected to the new master on
            # another connection, so this WAIT confirmed nothing about it.
            raise Unavailable("the session's Redis shard failed over during the write; retry")
        if isinstance(acked, Exception):
            raise acked
        if int(acked) < self.replicas:
            raise Unavailable(
                f"the write reached the Redis master but only {int(acked)} of {self.replicas} replicas "
                f"confirmed it within {self.timeout_ms} ms; retry (appends are idempotent by message id)"
            )
        return out
