"""SessionStore: session documents and messages in Redis.

The store is assembled from parts, one module each: what they share (store_base.py), messages
(store_messages.py), lifecycle writes with their events (store_lifecycle.py), per-user erasure
(store_erasure.py); this module holds the documents themselves (create, list, update). The parts share
no changing state but the append path's memo (append_memo.py), which only its owner changes: the
others tell it what changed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, cast

from redis.exceptions import ResponseError

from memlane import new_id

from ..errors import AlreadyExists, InvalidArgument
from ..ids import check_id
from ..paging import (
    MAX_PAGE_BYTES,
    MESSAGE_OVERHEAD_BYTES,
    cursor_of,
    decode_token,
    encode_token,
    page_size,
    query_fingerprint,
)
from . import scripts
from .codec import (
    encode_session,
    encode_summary,
)
from .limits import (
    check_list,
    check_metadata,
    check_short,
)
from .model import (
    PromotionState,
    Session,
    SessionStatus,
    Summary,
)
from .store_base import _SCAN_BUDGET, now_ms
from .store_erasure import ErasureOps
from .store_lifecycle import LifecycleOps
from .store_messages import (
    AppendOutcome,
    MessageFilter,
    MessageOps,
    default_visibility,
    with_session_defaults,
)

# The store's public names, wherever in its parts each is defined.
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


class SessionStore(MessageOps, LifecycleOps, ErasureOps):
    # ----------------------------------------------------------------- sessions

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
            raise self._script_error(exc, session_id) from exc

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
