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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import redis.asyncio as aioredis

from ..errors import Conflict, FailedPrecondition, MemlaneError, NotFound
from ..ids import check_id
from ..keyspace import KeySpace
from .channel_policies import PolicyBook
from .codec import LEGACY_FIELD, decode_policy
from .end_queue import REASON_CLOSED, REASON_EXPIRED, SessionEndQueue
from .events import EventLog, EventType, pending
from .keyspace import ExpirySubscriptions
from .model import PromotionState, Session, SessionStatus
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
        configure_keyspace_events: bool = True,
        sweep_interval_s: float = 1.0,
        dedupe_window_ms: int = 30_000,
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
