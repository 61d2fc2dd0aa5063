"""Keyspace expiry events from every Redis master, kept subscribed across reconnects and failovers.

Redis emits a keyspace event only on the node that owns the key, so on Redis Cluster one subscription per
master is needed. A supervisor re-reads the topology (``CLUSTER NODES``) every ``topology_interval_s``:
a replica promoted after its master died gets a subscription (and the ``notify-keyspace-events`` flags,
which are per node) within that interval; a node that is no longer a master loses its subscription.
Every (re)subscription calls ``on_subscribed`` because events fired meanwhile were lost: the caller
sweeps then. A single-node Redis is one "master" that never changes.

A listener never dies: any failure (a lost connection, an error redis-py raises from its cluster
bookkeeping, a subscription that hangs past ``subscribe_timeout_s``) is logged and retried with backoff,
and ``state`` says per node what it is doing, so a master left unsubscribed explains itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException, RedisError, ResponseError

log = logging.getLogger("memlane.keyspace")

_SINGLE = "single"
# RedisClusterException ("cannot be connected", no reachable node) is not a RedisError: without it a
# listener died for good when every node was briefly unreachable, and stop() re-raised its error.
_LOST = (RedisError, RedisClusterException, OSError)


def merge_keyspace_flags(current: str) -> str:
    """``current`` plus what expiry events need (E: keyevent channel, x: expired), nothing removed."""
    flags = current
    if "E" not in flags:
        flags += "E"
    if "x" not in flags and "A" not in flags:
        flags += "x"
    return flags


def masters_of(nodes: dict[str, dict[str, Any]]) -> set[str]:
    """``host:port`` of every master serving slots and not marked failed, from parsed CLUSTER NODES."""
    out = set()
    for name, info in nodes.items():
        flags = set(str(info.get("flags", "")).split(","))
        if "master" in flags and not flags & {"fail", "fail?", "noaddr", "handshake"} and info.get("slots"):
            out.add(name)
    return out


class ExpirySubscriptions:
    def __init__(
        self,
        redis: aioredis.Redis,
        *,
        on_expired: Callable[[str], Awaitable[None]],
        on_subscribed: Callable[[], None],
        configure_keyspace_events: bool = True,
        topology_interval_s: float = 1.0,
        subscribe_timeout_s: float = 10.0,
    ) -> None:
        self._redis = redis
        self._cluster: RedisCluster | None = redis if isinstance(redis, RedisCluster) else None
        self._on_expired = on_expired
        self._on_subscribed = on_subscribed
        self._configure = configure_keyspace_events
        self._interval = topology_interval_s
        self._subscribe_timeout = subscribe_timeout_s
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._live: set[str] = set()  # nodes whose subscription is confirmed
        self.all_live = asyncio.Event()  # every current master is subscribed
        self.state: dict[str, str] = {}  # node (or "topology") -> what it is doing or last failed with

    @property
    def nodes(self) -> set[str]:
        """The masters listened to right now (``single`` for a single-node Redis)."""
        return set(self._live)

    async def run(self) -> None:
        """Listens until cancelled."""
        try:
            cluster = self._cluster
            if cluster is None:
                self._reconcile({_SINGLE})
                await asyncio.Event().wait()
                return
            while True:
                try:
                    self._reconcile(masters_of(await cluster.cluster_nodes()))
                    self.state.pop("topology", None)
                except Exception as exc:  # the supervisor must outlive any failure
                    if "topology" not in self.state:  # once per outage, not once a second
                        log.warning("cannot read the cluster topology", extra={"error": repr(exc)})
                    self.state["topology"] = f"failing: {exc!r}"
                await asyncio.sleep(self._interval)
        finally:
            for t in self._tasks.values():
                t.cancel()
            for t in self._tasks.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            self._tasks.clear()

    def _reconcile(self, masters: set[str]) -> None:
        for name in set(self._tasks) - masters:
            log.info("no longer a master; dropping its expiry subscription", extra={"node": name})
            self._tasks.pop(name).cancel()
            self._live.discard(name)
            self.state.pop(name, None)
        for name in masters - set(self._tasks):
            self._tasks[name] = asyncio.create_task(self._listen(name), name=f"memlane-expiry-{name}")
        self._update_live()

    def _update_live(self) -> None:
        if self._tasks and set(self._tasks) <= self._live:
            self.all_live.set()
        else:
            self.all_live.clear()

    def _node(self, name: str) -> ClusterNode | None:
        assert self._cluster is not None
        host, _, port = name.rpartition(":")
        return self._cluster.get_node(host=host, port=int(port))

    async def _listen(self, name: str) -> None:
        backoff = 0.1
        while True:
            pubsub: Any = None
            self.state[name] = "subscribing"
            try:
                async with asyncio.timeout(self._subscribe_timeout):
                    pubsub = await self._subscribe(name)
                self._live.add(name)
                self.state[name] = "live"
                self._update_live()
                self._on_subscribed()  # events were lost while we were not subscribed: sweep now
                backoff = 0.1
                while True:
                    # A bounded wait rather than listen(): the pool's socket timeout would break a long read.
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is None or msg.get("type") != "message":
                        continue
                    data = msg["data"]
                    await self._on_expired(data.decode() if isinstance(data, bytes) else str(data))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a dead listener would stop expiry events unseen
                self._live.discard(name)
                self._update_live()
                self.state[name] = f"retrying after {exc!r}"
                if isinstance(exc, _LOST):
                    log.warning(
                        "expiry listener lost redis; resubscribing", extra={"node": name, "error": repr(exc)}
                    )
                else:
                    log.exception("expiry listener failed; resubscribing", extra={"node": name})
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()

    async def _subscribe(self, name: str) -> Any:
        """A pubsub subscribed to expiry events on ``name``, with the node's keyspace flags enabled."""
        if self._cluster is None:
            db = int(self._redis.connection_pool.connection_kwargs.get("db", 0) or 0)
            pubsub: Any = self._redis.pubsub()
            target: dict[str, Any] = {}
        else:
            node = self._node(name)
            if node is None:  # promoted before our client learnt of it: retry shortly
                raise OSError(f"node {name} not in the slot map yet")
            db, target = 0, {"target_nodes": node}
            pubsub = self._cluster.pubsub(node=node)
        try:
            await self._enable(target)
            await pubsub.subscribe(f"__keyevent@{db}__:expired")
        except BaseException:  # a failed or timed-out attempt must not leave its connection behind
            with contextlib.suppress(Exception):
                await pubsub.aclose()
            raise
        return pubsub

    async def _enable(self, target: dict[str, Any]) -> None:
        """Adds the expiry flags on this node (they are per node; a promoted replica may lack them)."""
        if not self._configure:
            return
        try:
            got: Any = await self._redis.config_get("notify-keyspace-events", **target)
            current = got.get("notify-keyspace-events", "")
            current = current.decode() if isinstance(current, bytes) else str(current)
            wanted = merge_keyspace_flags(current)
            if wanted != current:
                await self._redis.config_set("notify-keyspace-events", wanted, **target)
                log.info("enabled keyspace expiry events", extra={"flags": wanted})
        except ResponseError as exc:
            # Managed Redis often forbids CONFIG; the sweeper still ends every session, only later.
            log.warning("cannot enable keyspace events; relying on the sweeper", extra={"error": str(exc)})
