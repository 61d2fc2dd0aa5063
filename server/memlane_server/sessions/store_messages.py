"""The session store's messages: appending a batch, reading ranges and pages, restoring archived turns.

Cost model (the hot paths): an append is one EVALSHA for the whole batch plus one ZADD on the deadline
index, pipelined into a single round trip; reading the last N messages is one EVALSHA that returns N
payloads. Neither depends on the length of the history."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from redis.exceptions import NoScriptError, ResponseError

from memlane import new_id

from ..access.identity import UNRESTRICTED, Caller
from ..errors import Unavailable
from ..ids import check_id
from ..paging import (
    MAX_PAGE_BYTES,
    MESSAGE_OVERHEAD_BYTES,
    decode_token,
    encode_token,
    int_cursor,
    page_size,
    query_fingerprint,
)
from . import scripts
from .codec import (
    FINGERPRINT_LEN,
    LEGACY_FIELD,
    RETIREMENT_FIELDS,
    decode_message,
    decode_retirement,
    encode_message,
    fingerprint,
)
from .limits import (
    check_batch,
    message_bytes,
)
from .model import (
    Message,
    Role,
    Session,
    Topology,
    VisibilityKind,
)
from .store_base import _SCAN_BUDGET, StoreBase, now_ms

# Above this many characters per batch, token counting moves to the executor so the loop stays free.
_INLINE_TOKENIZE_CHARS = 16_384


@dataclass(slots=True)
class AppendOutcome:
    seqs: list[int]
    token_counts: list[int]
    duplicates: list[bool]
    message_ids: list[str]
    token_total: int
    message_count: int


class MessagePage(NamedTuple):
    messages: list[Message]
    next_token: str
    retired: bool  # the session was a retired stub: ``Resumer.ensure_hot`` brings its turns back


# What a page needs of the session document besides its turns, read by the same script: the defaults
# of the messages' user and channel, and the fields that say whether the session is retired.
_PAGE_DOC_FIELDS = ("user_id", "channel", *RETIREMENT_FIELDS, LEGACY_FIELD)


def is_retired(values: Sequence[bytes | None]) -> bool:
    """Whether the values of ``RETIREMENT_FIELDS`` and ``LEGACY_FIELD``, in that order, record one."""
    names = (*RETIREMENT_FIELDS, LEGACY_FIELD)
    g = {n: v.decode() for n, v in zip(names, values, strict=True) if v is not None}
    return decode_retirement(g) is not None


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


class MessageOps(StoreBase):
    async def append(
        self, session_id: str, messages: list[Message], writer: Caller = UNRESTRICTED, model: str = ""
    ) -> AppendOutcome:
        """Appends a batch atomically. Ids left empty are generated; tokens are counted here, once.
        Messages without a visibility get the session topology's default; ``writer`` may only write as
        itself and into its own groups."""
        check_id(session_id, "session_id")
        meta = await self._memo.meta(session_id)
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
        out = await self._append_current_ttl(
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

    async def _append_current_ttl(
        self, session_id: str, now: int, ttl_s: int, keys: list[str], args: list[Any]
    ) -> Any:
        """``_append_round_trip`` with the document's inactivity timeout: the script refuses a batch sent
        with another one (this process cached the session before another sidecar's UpdateSession changed
        it) before writing anything, so the batch goes again with the timeout it named."""
        for _ in range(3):
            try:
                return await self._append_round_trip(session_id, now, ttl_s, keys, args)
            except ResponseError as exc:
                if not str(exc).startswith("TTL "):
                    raise
                self._memo.document_changed(session_id)
                args[1] = int(float(str(exc).split(" ", 1)[1]))
                ttl_s = args[1] // 1000
        raise Unavailable(f"session {session_id!r}: its timeout kept changing under the append; retry")

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
                    out = await self._hot("EVALSHA", self._append.sha, len(keys), *keys, *args)
                except NoScriptError:
                    await self.redis.script_load(scripts.APPEND)
                    out = await self._hot("EVALSHA", self._append.sha, len(keys), *keys, *args)
        except ResponseError as exc:
            raise self._script_error(exc, session_id) from exc
        if ttl_s > 0:
            await self._memo.bump_deadline(session_id, now + ttl_s * 1000, ttl_s)
        return out

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
        return (await self._read_range_with(session_id, lo, hi, count, newest_first, doc_fields=()))[1]

    async def _read_range_with(
        self, session_id: str, lo: str, hi: str, count: int, newest_first: bool, *, doc_fields: Sequence[str]
    ) -> tuple[list[bytes | None], list[Message]]:
        """Messages by seq range, and ``doc_fields`` of the session document read by the same script:
        one EVALSHA, one round trip. On NOSCRIPT the script is loaded and the command resent."""
        k = self.keys.session(session_id)
        cmd = ("EVALSHA", self._read.sha, 3, k.doc, k.order, k.messages, lo, hi, count, int(newest_first))
        try:
            try:
                flat = await self._hot(*cmd, *doc_fields)
            except NoScriptError:
                await self.redis.script_load(scripts.READ_RANGE)
                flat = await self._hot(*cmd, *doc_fields)
        except ResponseError as exc:
            raise self._script_error(exc, session_id) from exc
        fields: list[bytes | None] = flat[: len(doc_fields)]
        out = []
        for i in range(len(doc_fields), len(flat), 3):
            payload = flat[i + 2]
            if len(payload) > FINGERPRINT_LEN:  # a message retired between ZRANGE and HGET is skipped
                out.append(decode_message(session_id, flat[i + 1].decode(), int(flat[i]), payload))
        return fields, out

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

    async def list_messages(self, session_id: str, f: MessageFilter, size: int, token: str) -> MessagePage:
        """One page, bounded by ``size`` items and by MAX_PAGE_BYTES (at least one message per page),
        and whether the session was retired when read (its turns are then in the archive)."""
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
        user_id: str | None = None
        channel = ""
        retired = False
        out: list[Message] = []
        page_bytes = scanned = 0
        more = False
        while not more:
            want = size + 1 if not f.active else max(size * 2, 64)
            if f.newest_first:
                lo, hi = "-inf", (f"({last}" if last is not None else "+inf")
            else:
                lo, hi = (f"({last}" if last is not None else "-inf"), "+inf"
            if user_id is None:
                # Read, not cached (after an erasure the id may belong to another user's new session),
                # in the first range read's round trip.
                (raw_user, raw_channel, *lifecycle), rows = await self._read_range_with(
                    session_id, lo, hi, want, f.newest_first, doc_fields=_PAGE_DOC_FIELDS
                )
                user_id, channel = (raw_user or b"").decode(), (raw_channel or b"").decode()
                retired = is_retired(lifecycle)
            else:
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
        return MessagePage(out, encode_token(q, [last]) if more and last is not None else "", retired)

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
