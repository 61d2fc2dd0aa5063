"""Session lifecycle: noticing that sessions went idle or ended, and saying so exactly once.

Inactivity is the TTL of each session's ``alive`` key, refreshed by every append. Two paths notice that
it ran out, because neither is enough alone:

- the **listener** subscribes to Redis keyspace expiry events (``notify-keyspace-events`` gains ``Ex``
  at start when the server allows CONFIG SET; existing flags are kept). Events are fast (tens of ms after
  the TTL at ``hz 10``) but fire-and-forget: none arrive while no sidecar listens.
- the **sweeper** scans the ``deadlines`` ZSET (kept by the store on create/append) for entries in the
  past. An entry may be early, never late (the store moves it lazily), so the sweeper checks the alive key
  before queueing anything and re-scores live sessions.

Either path only *queues* a session-end job (``end_queue``); the job's worker performs the EXPIRED
transition (an atomic script that refuses if the session was revived meanwhile) and runs the pipeline.
Only the sidecar whose transition moved the session emits the EXPIRED event.

Idle marking (active -> idle after the channel's idle threshold) uses its own ZSET of check times: a
session is looked at about once per idle threshold, and appends (which make an idle session active
again inside the append script) need no extra write.

Keyspace expiry events from every Redis master, kept subscribed across reconnects and failovers.

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

from ..errors import Conflict, FailedPrecondition, MemlaneError, NotFound
from ..ids import check_id
from ..keyspace import KeySpace
from .codec import LEGACY_FIELD, decode_policy
from .ending import REASON_CLOSED, REASON_EXPIRED, SessionEndQueue
from .events import EventLog, EventType, pending
from .model import PolicyBook, PromotionState, Session, SessionStatus
from .store import SessionStore, now_ms

log = logging.getLogger("memlane.lifecycle")

_ENDED = (SessionStatus.CLOSED, SessionStatus.EXPIRED)
_SWEEP_BATCH = 500


class Lifecycle:
    def __init__(
        self,
        redis: aioredis.Redis,
        store: SessionStore,
        keys: KeySpace,
        policies: PolicyBook,
        *,
        events: EventLog,
        queue: SessionEndQueue,
        configure_keyspace_events: bool,  # these three from the settings (wiring/), which hold the defaults
        sweep_interval_s: float,
        dedupe_window_ms: int,
    ) -> None:
        self._redis = redis
        self._store = store
        self._keys = keys
        self.policies = policies
        self.events = events
        self.queue = queue
        self._interval = sweep_interval_s
        self._dedupe_ms = dedupe_window_ms
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        self.subscriptions = ExpirySubscriptions(
            redis,
            on_expired=self._on_expired,
            on_subscribed=self._wake.set,
            configure_keyspace_events=configure_keyspace_events,
        )
        self.listening = self.subscriptions.all_live  # set while every master's expiry events reach us

    # ------------------------------------------------------------------ running

    async def start(self) -> None:
        await self.queue.ensure_group()
        self._tasks = [
            asyncio.create_task(self.subscriptions.run(), name="memlane-expiry-listener"),
            asyncio.create_task(self._sweep_loop(), name="memlane-sweeper"),
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    async def _on_expired(self, key: str) -> None:
        sid = self._keys.session_id_from_alive_key(key)
        if sid is not None:
            await self.queue.enqueue_once(sid, REASON_EXPIRED, now_ms(), self._dedupe_ms)

    async def _sweep_loop(self) -> None:
        while True:
            try:
                await self.sweep_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("session sweep failed; retrying next interval")
            with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow stop()'s cancel
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()
            self._wake.clear()

    # ------------------------------------------------------------------ sweeping

    async def sweep_once(self) -> int:
        """One pass over due deadlines and idle checks; returns how many sessions were queued to end."""
        queued = await self._sweep_deadlines(now_ms())
        await self._sweep_idle(now_ms())
        await self.events.relay_due(now_ms())
        return queued

    async def _sweep_deadlines(self, now: int) -> int:
        due: Any = await self._redis.zrangebyscore(
            self._keys.deadlines(), "-inf", now, start=0, num=_SWEEP_BATCH
        )
        if not due:
            return 0
        sids = [d.decode() for d in due]
        async with self._redis.pipeline(transaction=False) as pipe:
            for sid in sids:
                pipe.pttl(self._keys.session(sid).alive)
            ttls = await pipe.execute()
        queued = 0
        rescore: dict[str, int] = {}
        for sid, pttl in zip(sids, ttls, strict=True):
            if pttl is not None and int(pttl) > 0:
                rescore[sid] = now + int(pttl)  # an early entry: the session is alive, look again then
            elif int(pttl) == -1:
                await self._redis.zrem(self._keys.deadlines(), sid)  # alive without expiry: not ours to end
            else:
                queued += int(await self.queue.enqueue_once(sid, REASON_EXPIRED, now, self._dedupe_ms))
        if rescore:
            await self._redis.zadd(self._keys.deadlines(), dict[Any, Any](rescore), xx=True)
        return queued

    async def _sweep_idle(self, now: int) -> None:
        due: Any = await self._redis.zrangebyscore(
            self._keys.idle_due(), "-inf", now, start=0, num=_SWEEP_BATCH
        )
        if not due:
            return
        sids = [d.decode() for d in due]
        fields = ["status", "last_activity_at_ms", "channel", "policy", LEGACY_FIELD]
        async with self._redis.pipeline(transaction=False) as pipe:
            for sid in sids:
                pipe.hmget(self._keys.session(sid).doc, fields)
            rows = await pipe.execute()
        drop: list[str] = []
        rescore: dict[str, int] = {}
        for sid, row in zip(sids, rows, strict=True):
            g = {name: v.decode() for name, v in zip(fields, row, strict=True) if v is not None}
            if "status" not in g:
                drop.append(sid)
                continue
            status = SessionStatus(int(g["status"]))
            channel = g.get("channel", "")
            policy = decode_policy(g) or self.policies.for_channel(channel)
            idle_ms = int(policy.idle_after * 1000)
            if status in _ENDED or idle_ms <= 0:
                drop.append(sid)
                continue
            last = int(g.get("last_activity_at_ms") or 0)
            if status is SessionStatus.ACTIVE and last + idle_ms > now:
                rescore[sid] = last + idle_ms
                continue
            rescore[sid] = now + idle_ms  # idle (or just made idle): look again in case it wakes up
            if status is SessionStatus.ACTIVE:
                try:
                    prev = await self._store.transition(
                        sid,
                        SessionStatus.IDLE,
                        (SessionStatus.ACTIVE,),
                        "idle_at_ms",
                        event=pending(EventType.IDLE, now),
                        event_from=(SessionStatus.ACTIVE,),
                    )
                except (NotFound, FailedPrecondition):
                    continue
                if prev is SessionStatus.ACTIVE:
                    await self.events.relay(sid)
        if drop:
            await self._redis.zrem(self._keys.idle_due(), *drop)
        if rescore:
            await self._redis.zadd(self._keys.idle_due(), dict[Any, Any](rescore), xx=True)

    # ------------------------------------------------------------------ transitions

    async def created(self, s: Session) -> None:
        """Schedules the first idle check of a new session."""
        idle_ms = int(self.policies.for_session(s).idle_after * 1000)
        if idle_ms > 0:
            await self._redis.zadd(self._keys.idle_due(), {s.session_id: s.last_activity_at_ms + idle_ms})

    async def close(self, session_id: str) -> Session:
        """CloseSession: ends the session and queues its end pipeline. Repeating it is harmless (until the
        session is archived it queues one more job, a no-op if another finished first), and a retry after
        a crash between the two steps still queues the pipeline."""
        check_id(session_id, "session_id")
        live = (SessionStatus.ACTIVE, SessionStatus.IDLE)
        # Write-ahead: the state change and the job's XADD are on different slots, so a sidecar killed
        # between them would leave a CLOSED session with no job. The deadline entry, due after the
        # dedupe window, makes the sweeper queue one then (its alive key is gone; an ended session's job
        # runs the pipeline); it is dropped once the job is queued. (A crash before the transition, never
        # retried, leaves a live session that the sweeper then ends as EXPIRED: ended all the same.)
        await self._redis.zadd(self._keys.deadlines(), {session_id: now_ms() + self._dedupe_ms})
        try:
            prev = await self._store.transition(
                session_id,
                SessionStatus.CLOSED,
                (*live, SessionStatus.EXPIRED),
                "closed_at_ms",
                event=pending(EventType.CLOSED, now_ms()),
                event_from=live,
                untrack=False,
            )
        except MemlaneError:
            await self._track_again(session_id)  # refused, nothing changed: undo the write-ahead
            raise
        if prev in live:
            await self.events.relay(session_id)
            await self._redis.zrem(self._keys.idle_due(), session_id)
        s = await self._store.get(session_id)
        if s.promotion_state in (PromotionState.NONE, PromotionState.UNSPECIFIED):
            # Never de-duplicated: a marker only says some job was queued lately, and one left by a crash
            # before its XADD, or by an expiry job that found the session alive and is about to clear it,
            # would leave this session CLOSED with no job and nothing to queue one again. A close is one
            # caller's request (not N sidecars hearing one event), so a spare job costs one no-op run.
            await self.queue.enqueue(session_id, REASON_CLOSED, now_ms())
        await self._redis.zrem(self._keys.deadlines(), session_id)
        return s

    async def expire(self, session_id: str) -> Session | None:
        """The EXPIRED transition, run by the session-end worker. Returns the session if it has ended
        (now or before, expired or closed), None if it is alive again or gone."""
        live = (SessionStatus.ACTIVE, SessionStatus.IDLE)
        try:
            prev = await self._store.transition(
                session_id,
                SessionStatus.EXPIRED,
                live,
                "expired_at_ms",
                event=pending(EventType.EXPIRED, now_ms()),
                event_from=live,
            )
        except NotFound:
            await self._forget(session_id)
            return None
        except Conflict:
            # Revived between the expiry and now: track its new deadline again.
            pttl = int(await self._redis.pttl(self._keys.session(session_id).alive))
            if pttl > 0:
                await self._redis.zadd(self._keys.deadlines(), {session_id: now_ms() + pttl})
            return None
        except FailedPrecondition:
            prev = SessionStatus.CLOSED  # closed meanwhile: ended all the same
            await self._redis.zrem(self._keys.deadlines(), session_id)
        if prev in live:
            await self.events.relay(session_id)
            await self._redis.zrem(self._keys.idle_due(), session_id)
        s = await self._store.get(session_id)
        return s if s.status in _ENDED else None

    async def reactivate(self, session_id: str) -> Session:
        """An ended session becomes active again (resumption): status, inactivity TTL, deadline, idle
        check, and a fresh promotion state so its next end runs the pipeline for the new turns."""
        await self._store.transition(
            session_id,
            SessionStatus.ACTIVE,
            (SessionStatus.CLOSED, SessionStatus.EXPIRED, SessionStatus.IDLE),
        )
        await self._store.set_promotion_state(session_id, PromotionState.NONE)
        s = await self._store.get(session_id)
        now = now_ms()
        async with self._redis.pipeline(transaction=False) as pipe:
            if s.ttl_seconds > 0:
                pipe.set(self._keys.session(session_id).alive, 1, px=s.ttl_seconds * 1000)
                pipe.zadd(self._keys.deadlines(), {session_id: now + s.ttl_seconds * 1000})
            idle_ms = int(self.policies.for_session(s).idle_after * 1000)
            if idle_ms > 0:
                pipe.zadd(self._keys.idle_due(), {session_id: now + idle_ms})
            pipe.hset(self._keys.session(session_id).doc, "last_activity_at_ms", now)
            await pipe.execute()
        s.last_activity_at_ms = now
        return s

    async def revive(self, session_id: str) -> bool:
        """An append met the session EXPIRED (AppendMessages takes an expired session up again): ACTIVE
        with its RESUMED event (detail ``reason``: append), a fresh promotion state and its inactivity
        clock, then its deadline and idle check. Run under the session's pipeline lease, so no run of the
        last end's pipeline is half-way (it would set ARCHIVED over the fresh state). False if the session
        was not EXPIRED (another caller revived or closed it: the append's next try says which)."""
        event = pending(EventType.RESUMED, now_ms(), reason="append")
        if await self._store.resume_expired(session_id, event) is not SessionStatus.EXPIRED:
            return False
        s = await self._store.get(session_id)
        now = now_ms()
        async with self._redis.pipeline(transaction=False) as pipe:
            if s.ttl_seconds > 0:
                pipe.zadd(self._keys.deadlines(), {session_id: now + s.ttl_seconds * 1000})
            idle_ms = int(self.policies.for_session(s).idle_after * 1000)
            if idle_ms > 0:
                pipe.zadd(self._keys.idle_due(), {session_id: now + idle_ms})
            await pipe.execute()
        await self.events.relay(session_id)
        return True

    async def _track_again(self, session_id: str) -> None:
        """The deadline entry as it should be without a pending close: the alive key's, or none (a
        session without inactivity TTL must never meet the sweeper, which would expire it)."""
        pttl = int(await self._redis.pttl(self._keys.session(session_id).alive))
        if pttl > 0:
            await self._redis.zadd(self._keys.deadlines(), {session_id: now_ms() + pttl})
        else:
            await self._redis.zrem(self._keys.deadlines(), session_id)

    async def untrack(self, session_id: str) -> None:
        """An ended session needs no deadline entry: its job has been taken."""
        await self._redis.zrem(self._keys.deadlines(), session_id)

    async def _forget(self, session_id: str) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zrem(self._keys.deadlines(), session_id)
            pipe.zrem(self._keys.idle_due(), session_id)
            await pipe.execute()


# ---------------------------------------- expiry events from every master (see the module docstring)

expiry_log = logging.getLogger("memlane.keyspace")

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
                        expiry_log.warning("cannot read the cluster topology", extra={"error": repr(exc)})
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
            expiry_log.info("no longer a master; dropping its expiry subscription", extra={"node": name})
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
                    expiry_log.warning(
                        "expiry listener lost redis; resubscribing", extra={"node": name, "error": repr(exc)}
                    )
                else:
                    expiry_log.exception("expiry listener failed; resubscribing", extra={"node": name})
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
                expiry_log.info("enabled keyspace expiry events", extra={"flags": wanted})
        except ResponseError as exc:
            # Managed Redis often forbids CONFIG; the sweeper still ends every session, only later.
            expiry_log.warning(
                "cannot enable keyspace events; relying on the sweeper", extra={"error": str(exc)}
            )
