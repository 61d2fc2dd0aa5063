"""SessionStore: session documents and messages in Redis, one class a reader finds whole.

It holds the documents itself (create, read, list, update, summary, export) and a user's erasure (every
key of the user's sessions, the index and stream entries that name them), and composes two named
collaborators for the rest: ``messages`` (``messages.py``: the append path with its memo and its one
retry policy, reads, restores) and ``transitions`` (``transitions.py``: lifecycle moves, each with its
event). The methods callers use are all here; those of a collaborator say so in one line. The only
state the parts share that changes after construction is the append path's memo, which only
``messages`` changes: the others tell it what changed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from memlane import new_id

from ..access.identity import UNRESTRICTED, Caller
from ..errors import AlreadyExists, InvalidArgument, NotFound
from ..ids import check_id
from ..infra.redis_lane import as_dict, hot
from ..infra.redis_server import PersistenceReport, rewrite_persistence
from ..keyspace import KeySpace
from ..paging import (
    MAX_PAGE_BYTES,
    MESSAGE_OVERHEAD_BYTES,
    cursor_of,
    decode_token,
    encode_token,
    page_size,
    query_fingerprint,
)
from ..tokens import TokenCounter
from . import scripts
from .codec import decode_session, encode_session, encode_summary
from .events import PendingEvent, decode_entry
from .limits import Limits, check_list, check_metadata, check_short
from .messages import (
    SCAN_BUDGET,
    AppendMemo,
    AppendOutcome,
    MessagePage,
    SessionMessages,
    now_ms,
)
from .model import (
    Message,
    MessageFilter,
    PromotionState,
    Retirement,
    Session,
    SessionStatus,
    Summary,
    Topology,
    default_visibility,
    with_session_defaults,
)
from .scripts import Durability, script_error
from .transitions import SessionTransitions

# The store's public names, wherever each is defined.
__all__ = [
    "UPDATABLE_FIELDS",
    "AppendOutcome",
    "MessageFilter",
    "SessionFilter",
    "SessionStore",
    "default_visibility",
    "now_ms",
    "with_session_defaults",
]


@dataclass(slots=True)
class SessionFilter:
    user_id: str = ""
    status: SessionStatus = SessionStatus.UNSPECIFIED
    channel: str = ""
    created_after_ms: int = 0
    created_before_ms: int = 0
    promotion_state: PromotionState = PromotionState.UNSPECIFIED


def _session_bytes(s: Session) -> int:
    """Roughly what a session weighs on the wire (its stored fields as text)."""
    return sum(len(str(v).encode()) for v in encode_session(s).values()) + MESSAGE_OVERHEAD_BYTES


# Fields UpdateSession may set, with their validators.
UPDATABLE_FIELDS = frozenset({"tags", "metadata", "participants", "status", "group", "model", "ttl_seconds"})


class SessionStore:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: KeySpace,
        tokens: TokenCounter,
        *,
        limits: Limits,
        default_ttl_seconds: int,
        default_topology: Topology = Topology.SHARED,
        executor: Executor | None = None,
        durability: Durability | None = None,
    ) -> None:
        self.redis = redis
        self._durability = durability if durability is not None and durability.replicas > 0 else None
        self.keys = keys
        self.tokens = tokens
        self.limits = limits
        self.default_ttl_seconds = default_ttl_seconds
        self.default_topology = default_topology
        self._memo = AppendMemo(redis, keys)
        self.messages = SessionMessages(
            redis, keys, tokens, limits, self._memo, executor=executor, durability=self._durability
        )
        self.transitions = SessionTransitions(redis, keys, self._memo)
        self._create = redis.register_script(scripts.CREATE)
        self._set_summary = redis.register_script(scripts.SET_SUMMARY)

    # ----------------------------------------------------------------- sessions

    async def get(self, session_id: str) -> Session:
        check_id(session_id, "session_id")
        h = as_dict(await hot(self.redis, "HGETALL", self.keys.session(session_id).doc))
        if not h:
            raise NotFound(f"session {session_id!r} not found")
        return decode_session(h)

    async def get_many(self, session_ids: Sequence[str]) -> list[Session | None]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in session_ids:
                pipe.hgetall(self.keys.session(sid).doc)
            rows = await pipe.execute()
        return [decode_session(h) if h else None for h in rows]

    async def create(self, s: Session, *, default_ttl_seconds: int | None = None) -> tuple[Session, bool]:
        """Creates ``s`` (its id generated when empty) or returns the existing session of that id.

        ``default_ttl_seconds`` (the channel policy's expiry) replaces the store-wide default when
        ``s.ttl_seconds`` is 0; a policy default of 0 means no time expiry (explicit close only)."""
        self._check_new(s)
        s = replace(
            s,
            session_id=s.session_id or new_id(),
            status=SessionStatus.ACTIVE,
            promotion_state=PromotionState.NONE,
            topology=s.topology or self.default_topology,
            ttl_seconds=s.ttl_seconds
            or (self.default_ttl_seconds if default_ttl_seconds is None else default_ttl_seconds),
        )
        s.created_at_ms = s.last_activity_at_ms = now_ms()
        if not await self._insert(s):
            return await self.get(s.session_id), False
        return s, True

    async def import_session(self, s: Session) -> bool:
        """Writes an exported session document as it was (ImportUserData): status, times, summary and
        lifecycle kept. Only when the id is free: False when this user's session of that id is held
        already (an import run twice), AlreadyExists when another user's is."""
        check_id(s.session_id, "session_id")
        self._check_new(s)
        return await self._insert(s)

    def _check_new(self, s: Session) -> None:
        check_id(s.session_id, "session_id", required=False)
        check_id(s.user_id, "user_id")
        check_id(s.agent_id, "agent_id", required=False)
        for name in ("channel", "group", "model"):
            check_short(getattr(s, name), name, self.limits)
        check_metadata(s.metadata, "metadata", self.limits)
        check_list(s.participants, "participants", self.limits)
        check_list(s.tags, "tags", self.limits)
        if s.ttl_seconds < 0:
            raise InvalidArgument("ttl_seconds must not be negative")

    async def _insert(self, s: Session) -> bool:
        """The document if its id is free, then the indexes; an active session also gets its inactivity
        timer. False when a session of this user holds the id already."""
        k = self.keys.session(s.session_id)
        flat: list[Any] = []
        for name, value in encode_session(s).items():
            flat += [name, value]
        if self._durability is not None:
            created = bool(
                await self._durability.evalsha(self.redis, scripts.CREATE, self._create.sha, [k.doc], flat)
            )
        else:
            created = bool(await self._create(keys=[k.doc], args=flat))
        if not created:
            existing = await self.get(s.session_id)
            if existing.user_id != s.user_id:
                raise AlreadyExists(f"session_id {s.session_id!r} is taken by another user's session")
            return False
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(self.keys.all_sessions(), {s.session_id: s.created_at_ms})
            pipe.zadd(self.keys.user_sessions(s.user_id), {s.session_id: s.created_at_ms})
            if s.ttl_seconds > 0 and s.status is SessionStatus.ACTIVE:
                pipe.set(k.alive, 1, px=s.ttl_seconds * 1000)
                deadline = max(s.last_activity_at_ms, s.created_at_ms) + s.ttl_seconds * 1000
                pipe.zadd(self.keys.deadlines(), {s.session_id: deadline})
            await pipe.execute()
        return True

    # ----------------------------------------------------------------- users (ListUsers)

    async def users_with_sessions(self) -> set[str]:
        """Every user with a sessions index, read from the index keys' names (one SCAN)."""
        found: set[str] = set()
        async for raw in self.redis.scan_iter(match=self.keys.all_user_sessions(), count=1000):
            user = self.keys.user_id_from_sessions_key(raw.decode() if isinstance(raw, bytes) else str(raw))
            if user:
                found.add(user)
        return found

    async def session_counts(self, users: list[str]) -> list[tuple[int, int]]:
        """(sessions, the newest one's creation ms) of each user."""
        out = []
        for user in users:  # a page of users: one small round trip each
            key = self.keys.user_sessions(user)
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zcard(key)
                pipe.zrange(key, -1, -1, withscores=True)
                count, newest = await pipe.execute()
            out.append((int(count), int(newest[0][1]) if newest else 0))
        return out

    async def list_sessions(self, f: SessionFilter, size: int, token: str) -> tuple[list[Session], str]:
        """Newest first. The index is per user when ``f.user_id`` is set, else global."""
        if f.user_id:
            check_id(f.user_id, "user_id")
        size = page_size(size)
        q = query_fingerprint(
            "sessions",
            f.user_id,
            int(f.status),
            f.channel,
            f.created_after_ms,
            f.created_before_ms,
            int(f.promotion_state),
        )
        cursor = decode_token(token, q)
        index = self.keys.user_sessions(f.user_id) if f.user_id else self.keys.all_sessions()
        hi: float = f.created_before_ms - 1 if f.created_before_ms else float("inf")
        lo: float = f.created_after_ms or float("-inf")
        after: tuple[int, str] | None = None  # the (created ms, id) of the previous page's last session
        if cursor is not None:
            created, last_id = cursor_of(cursor, int, str)
            after = (created, last_id)
        if after is not None:
            hi = min(hi, after[0])
        out: list[Session] = []
        scanned = page_bytes = 0
        full = False  # the page reached its byte bound
        last: tuple[int, str] | None = after
        while len(out) < size and scanned < SCAN_BUDGET and not full:
            chunk = max(size * 2, 64)
            rows = cast(
                list[tuple[bytes, float]],
                await self.redis.zrevrangebyscore(index, hi, lo, start=0, num=chunk, withscores=True),
            )
            # Members that share the cursor's score and sort at or after it were already returned.
            if last is not None:
                rows = [(m, sc) for m, sc in rows if not (int(sc) == last[0] and m.decode() >= last[1])]
            if not rows:
                break
            docs = await self.get_many([m.decode() for m, _ in rows])
            for (member, score), doc in zip(rows, docs, strict=True):
                if doc is not None and self._session_matches(doc, f):
                    cost = _session_bytes(doc)
                    if out and page_bytes + cost > MAX_PAGE_BYTES:
                        full = True
                        break
                    out.append(doc)
                    page_bytes += cost
                scanned += 1
                last = (int(score), member.decode())
                if len(out) == size:
                    break
            hi = last[0] if last is not None else hi
            if len(rows) < chunk and len(out) < size and not full:
                last = None  # exhausted
                break
        next_token = encode_token(q, [last[0], last[1]]) if last is not None and len(out) > 0 else ""
        if last is not None and not out and scanned >= SCAN_BUDGET:
            next_token = encode_token(q, [last[0], last[1]])
        return out, next_token

    @staticmethod
    def _session_matches(s: Session, f: SessionFilter) -> bool:
        if f.status and s.status != f.status:
            return False
        if f.channel and s.channel != f.channel:
            return False
        return not (f.promotion_state and s.promotion_state != f.promotion_state)

    async def update(self, session_id: str, fields: dict[str, Any]) -> Session:
        """Sets the named fields (a subset of UPDATABLE_FIELDS) on an existing session."""
        unknown = set(fields) - UPDATABLE_FIELDS
        if unknown:
            raise InvalidArgument(
                f"update_mask names fields that cannot be updated: {', '.join(sorted(unknown))}; "
                f"updatable: {', '.join(sorted(UPDATABLE_FIELDS))}"
            )
        current = await self.get(session_id)
        status = fields.pop("status", None)
        if "metadata" in fields:
            check_metadata(fields["metadata"], "session.metadata", self.limits)
        for name in ("participants", "tags"):
            if name in fields:
                check_list(fields[name], f"session.{name}", self.limits)
        if fields.get("ttl_seconds", 0) < 0:
            raise InvalidArgument("session.ttl_seconds must not be negative")
        for name in ("group", "model"):
            if name in fields:
                check_short(fields[name], f"session.{name}", self.limits)
        if fields:
            self._memo.document_changed(session_id)
            probe = replace(current, **fields)
            enc = encode_session(probe)
            await self.redis.hset(self.keys.session(session_id).doc, mapping={n: enc[n] for n in fields})
            if "ttl_seconds" in fields:
                await self.retime(session_id)  # the running clock follows the new timeout
        if status is not None and status != current.status:
            await self.set_status(session_id, SessionStatus(status))
        return await self.get(session_id)

    async def set_status(self, session_id: str, to: SessionStatus) -> SessionStatus:
        """A caller-requested active <-> idle move. Ended sessions stay ended; closing and expiring are
        the lifecycle's (they emit events and queue the session-end job)."""
        allowed = {
            SessionStatus.ACTIVE: (SessionStatus.IDLE,),
            SessionStatus.IDLE: (SessionStatus.ACTIVE,),
        }.get(to)
        if allowed is None:
            raise InvalidArgument(
                f"status cannot be set to {to.name.lower()} by a caller (CloseSession closes)"
            )
        ts = "idle_at_ms" if to == SessionStatus.IDLE else ""
        return await self.transition(session_id, to, allowed, ts)

    async def set_summary(
        self, session_id: str, summary: Summary, expected_through_seq: int, read: Session | None = None
    ) -> None:
        """Compare-and-set: raises ``Conflict`` if the stored summary no longer ends at the expected seq,
        or, given the document the summarized turns were ``read`` with, if a message was removed since."""
        gap = "" if read is None else read.message_count - read.last_seq
        flat: list[Any] = [expected_through_seq, gap]
        for name, value in encode_summary(summary).items():
            flat += [name, value]
        try:
            await self._set_summary(keys=[self.keys.session(session_id).doc], args=flat)
        except ResponseError as exc:
            raise script_error(exc, session_id) from exc

    # ----------------------------------------------------------------- export, health and metrics

    @staticmethod
    def export_record(s: Session) -> dict[str, Any]:
        """A session document as ExportUserData yields it: its stored fields."""
        return dict(encode_session(s))

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    async def newest_session_ids(self, start: int, count: int) -> list[str]:
        """Ids of every session, newest first, from rank ``start`` (for sampled metrics)."""
        raw: Any = await self.redis.zrevrange(self.keys.all_sessions(), start, start + count - 1)
        return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]

    # ----------------------------------------------------------------- a user's export and erasure

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
        """Events of the session-end queue not yet relayed to the stream (sessions/events.py) that name
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

    # ----------------------------------------------------------------- messages (``messages``)

    async def append(
        self, session_id: str, messages: list[Message], writer: Caller = UNRESTRICTED, model: str = ""
    ) -> AppendOutcome:
        """``SessionMessages.append``: one batch, atomically; an expired session is refused."""
        return await self.messages.append(session_id, messages, writer, model)

    async def append_reviving(
        self,
        session_id: str,
        build: Callable[[], list[Message]],
        writer: Caller,
        revive: Callable[[str], Awaitable[Any]],
    ) -> AppendOutcome:
        """``SessionMessages.append_reviving``: AppendMessages, under the append path's retry policy."""
        return await self.messages.append_reviving(session_id, build, writer, revive)

    async def tail(self, session_id: str, limit: int) -> list[Message]:
        """``SessionMessages.tail``: the last ``limit`` messages, oldest first."""
        return await self.messages.tail(session_id, limit)

    async def range_by_seq(
        self, session_id: str, after_seq: int, until_seq: int, limit: int
    ) -> list[Message]:
        """``SessionMessages.range_by_seq``: ``after_seq < seq <= until_seq``, oldest first."""
        return await self.messages.range_by_seq(session_id, after_seq, until_seq, limit)

    async def list_messages(self, session_id: str, f: MessageFilter, size: int, token: str) -> MessagePage:
        """``SessionMessages.list_messages``: one page of ListMessages."""
        return await self.messages.list_messages(session_id, f, size, token)

    def all_messages(self, session_id: str, batch: int = 500) -> AsyncIterator[Message]:
        """``SessionMessages.all_messages``: every stored message, oldest first."""
        return self.messages.all_messages(session_id, batch)

    async def restore(self, session_id: str, messages: Sequence[Message]) -> None:
        """``SessionMessages.restore``: archived messages back under their ids and seqs."""
        await self.messages.restore(session_id, messages)

    # ----------------------------------------------------------------- lifecycle moves (``transitions``)

    async def transition(
        self,
        session_id: str,
        to: SessionStatus,
        allowed_from: Iterable[SessionStatus],
        ts_field: str = "",
        *,
        event: PendingEvent | None = None,
        event_from: Iterable[SessionStatus] = (),
        untrack: bool = True,
    ) -> SessionStatus:
        """``SessionTransitions.transition``: a status move, with its event; the previous status."""
        return await self.transitions.transition(
            session_id, to, allowed_from, ts_field, event=event, event_from=event_from, untrack=untrack
        )

    async def set_promotion_state(
        self,
        session_id: str,
        to: PromotionState,
        allowed_from: Iterable[PromotionState] = (),
        *,
        event: PendingEvent | None = None,
    ) -> PromotionState:
        """``SessionTransitions.set_promotion_state``: the previous promotion state."""
        return await self.transitions.set_promotion_state(session_id, to, allowed_from, event=event)

    async def retirement(self, session_id: str) -> Retirement | None:
        """``SessionTransitions.retirement``: the retirement record, if any."""
        return await self.transitions.retirement(session_id)

    async def retire_hot(
        self, s: Session, archived_through: int, retirement: Retirement, event: PendingEvent
    ) -> bool:
        """``SessionTransitions.retire_hot``: the hot data goes, a stub stays."""
        return await self.transitions.retire_hot(s, archived_through, retirement, event)

    async def finish_resume(self, s: Session, resumed_at_ms: int, event: PendingEvent) -> None:
        """``SessionTransitions.finish_resume``: resumption's last step."""
        await self.transitions.finish_resume(s, resumed_at_ms, event)

    async def resume_expired(self, session_id: str, event: PendingEvent) -> SessionStatus:
        """``SessionTransitions.resume_expired``: EXPIRED -> ACTIVE; the previous status."""
        return await self.transitions.resume_expired(session_id, event)

    async def retime(self, session_id: str) -> None:
        """``SessionTransitions.retime``: the inactivity clock follows a new timeout."""
        await self.transitions.retime(session_id)
