"""Replica acknowledgement for acknowledged writes (``redis_wait_replicas``).

Redis replicates asynchronously: a master that dies right after answering may take the last writes with
it, and its promoted replica never saw them. With ``replicas > 0`` a write script is followed by ``WAIT
replicas timeout`` **on the same connection** (WAIT counts the replication offset of that connection's
writes, so it must share the pipeline; on Redis Cluster both commands go to the node owning the session's
slot). If fewer replicas confirm within the timeout the write is reported UNAVAILABLE: it happened on the
master and may or may not survive a failover, and a retry with the same message ids is idempotent.
Replication is in order, so a later confirmed write also confirms every earlier one on that master.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError

from ..errors import Unavailable


@dataclass(frozen=True, slots=True)
class Durability:
    replicas: int = 0  # 0: answer as soon as the master has the write (Redis's default)
    timeout_ms: int = 1000

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
        cluster = redis if isinstance(redis, RedisCluster) else None
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
