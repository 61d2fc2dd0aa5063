"""SessionStore: session documents and messages in Redis.

Cost model (the hot paths): an append is one EVALSHA for the whole batch plus one ZADD on the deadline
index, pipelined into a single round trip; reading the last N messages is one EVALSHA that returns N
payloads. Neither depends on the length of the history.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, cast

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, ResponseError

from ..access.identity import UNRESTRICTED, Caller
from ..errors import AlreadyExists, Conflict, FailedPrecondition, InvalidArgument, NotFound, Unavailable
from ..infra.redis_persistence import PersistenceReport, rewrite_persistence
from ..tokens import TokenCounter
from . import scripts
from .codec import (
    FINGERPRINT_LEN,
    LEGACY_FIELD,
    LIFECYCLE_FIELDS,
    RETIREMENT_FIELDS,
    decode_message,
    decode_retirement,
    decode_session,
    encode_lifecycle,
    encode_message,
    encode_session,
    encode_summary,
    fingerprint,
)
from .durability import Durability
from .ids import check_id, new_id
from .keys import KeySpace
from .limits import (
    Limits,
    check_batch,
    check_list,
    check_metadata,
    check_short,
    message_bytes,
)
from .model import (
    Message,
    PromotionState,
    Retirement,
    Role,
    Session,
    SessionStatus,
    Summary,
    Topology,
    VisibilityKind,
)
from .outbox import NO_EVENT, OutboxWriter, PendingEvent, decode_entry
from .paging import (
    MAX_PAGE_BYTES,
    MESSAGE_OVERHEAD_BYTES,
    decode_token,
    encode_token,
    int_cursor,
    page_size,
    query_fingerprint,
)

# Above this many characters per batch, token counting moves to the executor so the loop stays free.
_INLINE_TOKENIZE_CHARS = 16_384
# A filtered listing reads at most this many messages per call and then returns a (maybe short) page.
_SCAN_BUDGET = 5_000

# Status transitions a caller may ask for (UpdateSession / CloseSession); the lifecycle moves the rest.
_ENDED = (SessionStatus.CLOSED, SessionStatus.EXPIRED)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class AppendOutcome:
    seqs: list[int]
    token_counts: list[int]
    duplicates: list[bool]
    message_ids: list[str]
    token_total: int
    message_count: int


@dataclass(slots=True)
class SessionFilter:
    user_id: str = ""
    status: SessionStatus = SessionStatus.UNSPECIFIED
    channel: str = ""
    created_after_ms: int = 0
    created_before_ms: int = 0
    promotion_state: PromotionState = PromotionState.UNSPECIFIED


@dataclass(slots=True)
class MessageFilter:
    newest_first: bool = False
    after_ms: int = 0
    before_ms: int = 0
    roles: frozenset[Role] = field(default_factory=frozenset)
    source_agent_ids: frozenset[str] = field(default_factory=frozenset)
    participant_names: frozenset[str] = field(default_factory=frozenset)
    user_ids: frozenset[str] = field(default_factory=frozenset)  # compared after the session default
    viewer: Caller = UNRESTRICTED  # messages the viewer may not see are skipped silently

    def matches(self, m: Message) -> bool:
        if not self.viewer.can_see(m.visibility, m.source_agent_id, m.visibility_group):
            return False
        if self.after_ms and m.created_at_ms < self.after_ms:
            return False
        if self.before_ms and m.created_at_ms >= self.before_ms:
            return False
        if self.roles and m.role not in self.roles:
            return False
        if self.participant_names and m.participant_name not in self.participant_names:
            return False
        if self.user_ids and m.user_id not in self.user_ids:
            return False
        return not (self.source_agent_ids and m.source_agent_id not in self.source_agent_ids)

    @property
    def active(self) -> bool:
        narrowed = (
            self.after_ms
            or self.before_ms
            or self.roles
            or self.source_agent_ids
            or self.participant_names
            or self.user_ids
        )
        return bool(narrowed or not self.viewer.unrestricted)


class _SessionMeta(NamedTuple):
    ttl_seconds: int
    model: str
    topology: Topology
    group: str


def _session_bytes(s: Session) -> int:
    """Roughly what a session weighs on the wire (its stored fields as text)."""
    return sum(len(str(v).encode()) for v in encode_session(s).values()) + MESSAGE_OVERHEAD_BYTES


def with_session_defaults(m: Message, user_id: str, channel: str) -> Message:
    """A message's user and channel default to its session's (stored empty, so the default follows the
    session); readers get them filled, as the proto promises."""
    m.user_id = m.user_id or user_id
    m.channel = m.channel or channel
    return m


_DEFAULT_VISIBILITY = {
    Topology.UNSPECIFIED: VisibilityKind.SESSION,
    Topology.SHARED: VisibilityKind.SESSION,
    Topology.DISTRIBUTED: VisibilityKind.AGENT,
    Topology.SELECTIVE: VisibilityKind.GROUP,
}


def default_visibility(s: Session) -> tuple[VisibilityKind, str]:
    """The visibility (and group) a session's topology gives what is written without one: its messages,
    and its framework checkpoints, which are one agent's memory in a distributed session."""
    vis = _DEFAULT_VISIBILITY[Topology(s.topology or Topology.SHARED)]
    return vis, s.group if vis == VisibilityKind.GROUP else ""


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
        self._executor = executor
        self._meta_cache: dict[str, _SessionMeta] = {}
        # redis-py leaves execute_command untyped; this is the bare, cheapest way to send one command.
        self._command = cast(Callable[..., Awaitable[Any]], redis.execute_command)
        self._deadline_bumped: dict[str, int] = {}
        self._append = redis.register_script(scripts.APPEND)
        self._read = redis.register_script(scripts.READ_RANGE)
        self._transition = redis.register_script(scripts.TRANSITION)
        self._set_summary = redis.register_script(scripts.SET_SUMMARY)
        self._set_promotion = redis.register_script(scripts.SET_PROMOTION)
        self._create = redis.register_script(scripts.CREATE)
        self._retire = redis.register_script(scripts.RETIRE)
        self._set_lifecycle = redis.register_script(scripts.SET_LIFECYCLE)
        self._outbox = OutboxWriter(redis, keys)

    # ----------------------------------------------------------------- sessions

    async def create(self, s: Session, *, default_ttl_seconds: int | None = None) -> tuple[Session, bool]:
        """Creates ``s`` (its id generated when empty) or returns the existing session of that id.

        ``default_ttl_seconds`` (the channel policy's expiry) replaces the store-wide default when
        ``s.ttl_seconds`` is 0; a policy default of 0 means no time expiry (explicit close only)."""
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
            return existing, False
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(self.keys.all_sessions(), {s.session_id: s.created_at_ms})
            pipe.zadd(self.keys.user_sessions(s.user_id), {s.session_id: s.created_at_ms})
            if s.ttl_seconds > 0:
                pipe.set(k.alive, 1, px=s.ttl_seconds * 1000)
                pipe.zadd(self.keys.deadlines(), {s.session_id: s.created_at_ms + s.ttl_seconds * 1000})
            await pipe.execute()
        return s, True

    async def get(self, session_id: str) -> Session:
        check_id(session_id, "session_id")
        h = cast(dict[bytes, bytes], await self.redis.hgetall(self.keys.session(session_id).doc))
        if not h:
            raise NotFound(f"session {session_id!r} not found")
        return decode_session(h)

    async def get_many(self, session_ids: Sequence[str]) -> list[Session | None]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in session_ids:
                pipe.hgetall(self.keys.session(sid).doc)
            rows = await pipe.execute()
        return [decode_session(h) if h else None for h in rows]

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
        after: tuple[int, str] | None = None
        if cursor is not None:
            try:
                after = (int(cursor[0]), str(cursor[1]))
            except (IndexError, ValueError, TypeError) as exc:
                raise InvalidArgument("page_token is malformed; start again without it") from exc
            hi = min(hi, after[0])
        out: list[Session] = []
        scanned = page_bytes = 0
        full = False  # the page reached its byte bound
        last: tuple[int, str] | None = after
        while len(out) < size and scanned < _SCAN_BUDGET and not full:
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
        if last is not None and not out and scanned >= _SCAN_BUDGET:
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
            self._meta_cache.pop(session_id, None)
            probe = replace(current, **fields)
            enc = encode_session(probe)
            await self.redis.hset(self.keys.session(session_id).doc, mapping={n: enc[n] for n in fields})
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

    async def transition(
        self,
        session_id: str,
        to: SessionStatus,
        allowed_from: Iterable[SessionStatus],
        ts_field: str = "",
        *,
        event: PendingEvent | None = None,
        event_from: Iterable[SessionStatus] = (),
    ) -> SessionStatus:
        """Moves the session to ``to`` if it is in one of ``allowed_from``; returns the previous status.
        Reaching CLOSED/EXPIRED removes the session from the deadline index. ``event`` is written to the
        session's outbox in the same script when the move starts from one of ``event_from``."""
        k = self.keys.session(session_id)
        head: list[Any] = [
            int(to),
            ts_field,
            event.at_ms if event is not None else now_ms(),
            ",".join(str(int(s)) for s in allowed_from),
            ",".join(str(int(s)) for s in event_from),
        ]
        prev = await self._evented(
            session_id,
            event,
            lambda ev: self._transition(keys=[k.doc, k.alive, self.keys.outbox(session_id)], args=head + ev),
        )
        if to in _ENDED:
            await self.redis.zrem(self.keys.deadlines(), session_id)
        return SessionStatus(int(prev))

    async def set_promotion_state(
        self,
        session_id: str,
        to: PromotionState,
        allowed_from: Iterable[PromotionState] = (),
        *,
        event: PendingEvent | None = None,
    ) -> PromotionState:
        """Moves the promotion state; ``event`` is written with it when the state changes."""
        k = self.keys.session(session_id)
        head: list[Any] = [int(to), ",".join(str(int(s)) for s in allowed_from)]
        prev = await self._evented(
            session_id,
            event,
            lambda ev: self._set_promotion(keys=[k.doc, self.keys.outbox(session_id)], args=head + ev),
        )
        return PromotionState(int(prev))

    async def retirement(self, session_id: str) -> Retirement | None:
        """The session's retirement record (None: hot, or unknown); one HMGET."""
        fields = [*RETIREMENT_FIELDS, LEGACY_FIELD]
        row: Any = await self.redis.hmget(self.keys.session(session_id).doc, fields)
        return decode_retirement({n: v.decode() for n, v in zip(fields, row, strict=True) if v is not None})

    async def retire_hot(
        self, s: Session, archived_through: int, retirement: Retirement, event: PendingEvent
    ) -> bool:
        """Drops the messages and traces of the archived session ``s``, keeping a stub with
        ``retirement``, unless anything was written since the archive; writes ``event`` if it did."""
        sid = s.session_id
        k = self.keys.session(sid)
        keys = [k.doc, k.messages, k.order, k.traces, k.trace_data, self.keys.outbox(sid)]
        fields: list[Any] = []
        for name, value in encode_lifecycle(s.policy, retirement, s.resumed_at_ms).items():
            fields += [name, value]
        done = await self._evented(
            sid, event, lambda ev: self._retire(keys=keys, args=[archived_through, *ev, *fields])
        )
        self._meta_cache.pop(sid, None)
        return bool(done)

    async def finish_resume(self, s: Session, resumed_at_ms: int, event: PendingEvent) -> None:
        """Clears the retirement of ``s`` (resumption's last step) and records when, with ``event``."""
        keys = [self.keys.session(s.session_id).doc, self.keys.outbox(s.session_id)]
        kept = encode_lifecycle(s.policy, None, resumed_at_ms)
        fields: list[Any] = []
        for name, value in kept.items():
            fields += [name, value]
        gone = " ".join(n for n in LIFECYCLE_FIELDS if n not in kept)
        await self._evented(
            s.session_id, event, lambda ev: self._set_lifecycle(keys=keys, args=[*ev, gone, *fields])
        )

    async def _evented(
        self, session_id: str, event: PendingEvent | None, run: Callable[[list[Any]], Awaitable[Any]]
    ) -> Any:
        """Runs a state-changing script with its event's ARGV: reserves the outbox pointer first, and
        again if the script found the reservation too old (FENCE: this writer stalled)."""
        for _ in range(3):
            ev = list(NO_EVENT) if event is None else await self._outbox.reserve(session_id, event, now_ms())
            try:
                return await run(ev)
            except ResponseError as exc:
                if str(exc).startswith("FENCE"):
                    continue
                raise self._script_error(exc, session_id) from exc
        raise Unavailable(f"session {session_id!r}: event write kept missing its fence; retry")

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
            raise self._script_error(exc, session_id) from exc

    # ----------------------------------------------------------------- messages

    async def append(
        self, session_id: str, messages: list[Message], writer: Caller = UNRESTRICTED, model: str = ""
    ) -> AppendOutcome:
        """Appends a batch atomically. Ids left empty are generated; tokens are counted here, once.
        Messages without a visibility get the session topology's default; ``writer`` may only write as
        itself and into its own groups."""
        check_id(session_id, "session_id")
        meta = await self._session_meta(session_id)
        now = now_ms()
        fps: list[str] = []
        for i, m in enumerate(messages):
            fps.append(fingerprint(self._client_fields(m)))  # before defaults, so a retry matches
            if not m.message_id:
                m.message_id = new_id()
            if not m.created_at_ms:
                m.created_at_ms = now
            m.session_id = session_id
            if not m.source_agent_id:
                m.source_agent_id = writer.agent_id
            if m.visibility == VisibilityKind.UNSPECIFIED:
                m.visibility, default_group = _DEFAULT_VISIBILITY[meta.topology], meta.group
                if m.visibility == VisibilityKind.GROUP:
                    if not default_group:
                        m.visibility = VisibilityKind.SESSION  # a selective session without a group
                    m.visibility_group = m.visibility_group or default_group
            writer.check_write(int(m.visibility), m.source_agent_id, m.visibility_group, f"messages[{i}]")
        check_batch(messages, self.limits, now)
        ttl_s = meta.ttl_seconds
        model = model or meta.model
        texts = [m.content for m in messages]
        if sum(len(t) for t in texts) > _INLINE_TOKENIZE_CHARS:
            counts = await asyncio.get_running_loop().run_in_executor(
                self._executor, self.tokens.count_many, texts, model
            )
        else:
            counts = self.tokens.count_many(texts, model)
        args: list[Any] = [now, 0, len(messages)]
        for m, fp, n in zip(messages, fps, counts, strict=True):
            m.token_count = n
            args += [m.message_id, fp, encode_message(m), n]
        k = self.keys.session(session_id)
        args[1] = ttl_s * 1000
        out = await self._append_round_trip(
            session_id, now, ttl_s, [k.doc, k.messages, k.order, k.alive], args
        )
        seqs = [int(x) for x in out[2::2]]
        dups = [bool(int(x)) for x in out[3::2]]
        for m, seq in zip(messages, seqs, strict=True):
            m.seq = seq
        return AppendOutcome(
            seqs=seqs,
            token_counts=counts,
            duplicates=dups,
            message_ids=[m.message_id for m in messages],
            token_total=int(out[0]),
            message_count=int(out[1]),
        )

    async def _append_round_trip(
        self, session_id: str, now: int, ttl_s: int, keys: list[str], args: list[Any]
    ) -> Any:
        """One EVALSHA, sent as a bare command: redis-py's Script and pipeline wrappers cost more than the
        round trip itself. On NOSCRIPT (a fresh or restarted Redis) the script is loaded and sent again;
        nothing ran the first time."""
        try:
            if self._durability is not None:  # EVALSHA + WAIT for replicas on one connection
                out = await self._durability.evalsha(self.redis, scripts.APPEND, self._append.sha, keys, args)
            else:
                try:
                    out = await self._command("EVALSHA", self._append.sha, len(keys), *keys, *args)
                except NoScriptError:
                    await self.redis.script_load(scripts.APPEND)
                    out = await self._command("EVALSHA", self._append.sha, len(keys), *keys, *args)
        except ResponseError as exc:
            raise self._script_error(exc, session_id) from exc
        if ttl_s > 0:
            await self._bump_deadline(session_id, now + ttl_s * 1000, ttl_s)
        return out

    async def _bump_deadline(self, session_id: str, deadline_ms: int, ttl_s: int) -> None:
        """Keeps the sweeper's deadline index roughly current without a write per append: the entry moves
        only once a tenth of the TTL has passed since it was last moved. An entry may therefore be early,
        never late; the sweeper confirms with the ``alive`` key (which every append refreshes exactly)
        before it ends a session."""
        last = self._deadline_bumped.get(session_id, 0)
        if deadline_ms - last < ttl_s * 100:
            return
        if len(self._deadline_bumped) > 10_000:
            self._deadline_bumped.clear()
        self._deadline_bumped[session_id] = deadline_ms
        # The append script has just proved the session exists; a session revived after expiry
        # re-enters the index here.
        await self.redis.zadd(self.keys.deadlines(), {session_id: deadline_ms})

    async def _session_meta(self, session_id: str) -> _SessionMeta:
        """What the append path needs of the document. It changes rarely, so a small per-process cache
        keeps appends at one round trip; UpdateSession invalidates it."""
        meta = self._meta_cache.get(session_id)
        if meta is None:
            ttl, model, topology, group = cast(
                list[bytes | None],
                await self.redis.hmget(
                    self.keys.session(session_id).doc, ["ttl_seconds", "model", "topology", "group"]
                ),
            )
            meta = _SessionMeta(
                int(ttl or 0),
                (model or b"").decode(),
                Topology(int(topology or Topology.SHARED)),
                (group or b"").decode(),
            )
            if ttl is not None:
                if len(self._meta_cache) > 10_000:
                    self._meta_cache.clear()
                self._meta_cache[session_id] = meta
        return meta

    @staticmethod
    def _client_fields(m: Message) -> dict[str, Any]:
        return {
            "r": int(m.role),
            "c": m.content,
            "a": m.source_agent_id,
            "p": m.participant_name,
            "u": m.user_id,
            "ch": m.channel,
            "nf": m.native_format,
            "nj": m.native_json,
            "ps": m.planning_steps,
            "iv": m.invoked,
            "tc": m.tool_call_ids,
            "md": m.metadata,
            "tr": m.transient,
            "v": int(m.visibility),
            "vg": m.visibility_group,
            "t": m.created_at_ms,
        }

    async def _read_range(
        self, session_id: str, lo: str, hi: str, count: int, newest_first: bool
    ) -> list[Message]:
        k = self.keys.session(session_id)
        try:
            flat = await self._read(
                keys=[k.doc, k.order, k.messages], args=[lo, hi, count, int(newest_first)]
            )
        except ResponseError as exc:
            raise self._script_error(exc, session_id) from exc
        out = []
        for i in range(0, len(flat), 3):
            payload = flat[i + 2]
            if len(payload) > FINGERPRINT_LEN:  # a message retired between ZRANGE and HGET is skipped
                out.append(decode_message(session_id, flat[i + 1].decode(), int(flat[i]), payload))
        return out

    async def restore(self, session_id: str, messages: Sequence[Message]) -> None:
        """Puts archived messages back under their original ids and seqs (resumption of a retired
        session). Idempotent: restoring the same message twice writes the same bytes twice."""
        if not messages:
            return
        k = self.keys.session(session_id)
        payloads = {
            m.message_id: fingerprint(self._client_fields(m)).encode() + encode_message(m) for m in messages
        }
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(k.messages, mapping=payloads)  # type: ignore[arg-type]
            pipe.zadd(k.order, {m.message_id: m.seq for m in messages})
            await pipe.execute()

    async def tail(self, session_id: str, limit: int) -> list[Message]:
        """The last ``limit`` messages, oldest first."""
        msgs = await self._read_range(session_id, "-inf", "+inf", limit, newest_first=True)
        msgs.reverse()
        return msgs

    async def range_by_seq(
        self, session_id: str, after_seq: int, until_seq: int, limit: int
    ) -> list[Message]:
        """Messages with ``after_seq < seq <= until_seq``, oldest first, at most ``limit``."""
        return await self._read_range(session_id, f"({after_seq}", str(until_seq), limit, newest_first=False)

    async def list_messages(
        self, session_id: str, f: MessageFilter, size: int, token: str
    ) -> tuple[list[Message], str]:
        """One page, bounded by ``size`` items and by MAX_PAGE_BYTES (at least one message per page)."""
        check_id(session_id, "session_id")
        size = page_size(size)
        q = query_fingerprint(
            "msgs",
            session_id,
            f.newest_first,
            f.after_ms,
            f.before_ms,
            sorted(int(r) for r in f.roles),
            sorted(f.source_agent_ids),
            sorted(f.participant_names),
            sorted(f.user_ids),
        )
        cursor = decode_token(token, q)
        last: int | None = int_cursor(cursor, 1)[0] if cursor is not None else None
        # Read, not cached: after an erasure the id may belong to another user's new session.
        raw_user, raw_channel = cast(
            list[bytes | None],
            await self.redis.hmget(self.keys.session(session_id).doc, ["user_id", "channel"]),
        )
        user_id, channel = (raw_user or b"").decode(), (raw_channel or b"").decode()
        out: list[Message] = []
        page_bytes = scanned = 0
        more = False
        while not more:
            want = size + 1 if not f.active else max(size * 2, 64)
            if f.newest_first:
                lo, hi = "-inf", (f"({last}" if last is not None else "+inf")
            else:
                lo, hi = (f"({last}" if last is not None else "-inf"), "+inf"
            rows = await self._read_range(session_id, lo, hi, want, f.newest_first)
            for m in rows:
                if len(out) == size:
                    more = True
                    break
                if f.matches(with_session_defaults(m, user_id, channel)):
                    cost = message_bytes(m) + MESSAGE_OVERHEAD_BYTES
                    if out and page_bytes + cost > MAX_PAGE_BYTES:
                        more = True
                        break
                    out.append(m)
                    page_bytes += cost
                scanned += 1
                last = m.seq
            if more or len(rows) < want:
                break
            more = len(out) == size or scanned >= _SCAN_BUDGET  # a short page; the token resumes the scan
        return out, (encode_token(q, [last]) if more and last is not None else "")

    # ----------------------------------------------------------------- per-user export and erasure

    async def session_ids_of_user(self, user_id: str) -> list[str]:
        check_id(user_id, "user_id")
        raw = cast(list[bytes], await self.redis.zrange(self.keys.user_sessions(user_id), 0, -1))
        return [r.decode() for r in raw]

    async def all_messages(self, session_id: str, batch: int = 500) -> AsyncIterator[Message]:
        """Every stored message of a session, oldest first, read in batches."""
        last = 0
        while True:
            page = await self._read_range(session_id, f"({last}", "+inf", batch, newest_first=False)
            for m in page:
                yield m
            if len(page) < batch:
                return
            last = page[-1].seq

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
                self._meta_cache.pop(sid, None)
                self._deadline_bumped.pop(sid, None)
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

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    async def newest_session_ids(self, start: int, count: int) -> list[str]:
        """Ids of every session, newest first, from rank ``start`` (for sampled metrics)."""
        raw: Any = await self.redis.zrevrange(self.keys.all_sessions(), start, start + count - 1)
        return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]

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

    # ----------------------------------------------------------------- errors

    @staticmethod
    def _script_error(exc: ResponseError, session_id: str) -> Exception:
        msg = str(exc)
        word = msg.split(" ", 1)[0]
        if word == "NOTFOUND":
            return NotFound(f"session {session_id!r} not found")
        if word == "CLOSED":
            return FailedPrecondition(f"session {session_id!r} is closed; start a new session")
        if word == "CONFLICT":
            mid = msg.split(" ")[1] if " " in msg else "?"
            return AlreadyExists(
                f"message_id {mid!r} already exists in session {session_id!r} with different content"
            )
        if word == "ILLEGAL":
            cur = msg.split(" ")[1] if " " in msg else "?"
            try:
                name = SessionStatus(int(cur)).name.lower()
            except ValueError:
                name = cur
            return FailedPrecondition(f"session {session_id!r} is {name}; that transition is not allowed")
        if word == "ALIVE":
            return Conflict(f"session {session_id!r} was active again before it could expire")
        if word == "STALE":
            return Conflict(f"summary of session {session_id!r} changed since it was read; re-read and retry")
        return exc
