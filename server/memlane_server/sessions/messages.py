"""A session's messages (``SessionMessages``, a collaborator of ``SessionStore``): appending a batch,
reading ranges and pages, restoring archived turns.

Cost model (the hot paths): an append is one EVALSHA for the whole batch plus one ZADD on the deadline
index, pipelined into a single round trip; reading the last N messages is one EVALSHA that returns N
payloads. Neither depends on the length of the history.

The append path has one retry policy, stated in one place (``AppendRetries``) and applied in one loop
(``SessionMessages._append_retrying``): which refusals are sent again, how often, and why.

What the append path remembers of each session between appends, so an append stays one round trip
(``AppendMemo``): two per-process facts, owned here and changed nowhere else: the few document fields an
append needs (timeout, model, topology, group: they change rarely) and the deadline this process last
wrote to the sweeper's index (moved only once a tenth of the timeout has passed). The store's other
writers do not touch them; they say what changed (``document_changed``, ``deadline_moved``, ``forget``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, ResponseError

from memlane import new_id

from ..access.identity import UNRESTRICTED, Caller
from ..errors import SessionExpired, Unavailable
from ..ids import check_id
from ..infra.redis_lane import hot
from ..keyspace import KeySpace
from ..paging import (
    MAX_PAGE_BYTES,
    MESSAGE_OVERHEAD_BYTES,
    decode_token,
    encode_token,
    int_cursor,
    page_size,
    query_fingerprint,
)
from ..tokens import TokenCounter
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
    Limits,
    check_batch,
    message_bytes,
)
from .model import (
    DEFAULT_VISIBILITY,
    Message,
    MessageFilter,
    Topology,
    VisibilityKind,
    with_session_defaults,
)
from .scripts import Durability, script_error


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# A filtered listing reads at most this many messages (or sessions) per call and then returns a (maybe
# short) page.
SCAN_BUDGET = 5_000
# Above this many characters per batch, token counting moves to the executor so the loop stays free.
_INLINE_TOKENIZE_CHARS = 16_384

# ---------------------------------------- the append path's memo (see the module docstring)

# Each memo holds at most this many sessions; past it, it starts afresh (a miss costs one read).
_MAX_SESSIONS = 10_000


class AppendMeta(NamedTuple):
    ttl_seconds: int
    model: str
    topology: Topology
    group: str


class AppendMemo:
    def __init__(self, redis: aioredis.Redis, keys: KeySpace) -> None:
        self._redis = redis
        self._keys = keys
        self._meta: dict[str, AppendMeta] = {}
        self._deadline: dict[str, int] = {}

    async def meta(self, session_id: str) -> AppendMeta:
        """The document fields an append needs: remembered, else one HMGET (a missing document is not
        remembered, so the append script reports it)."""
        meta = self._meta.get(session_id)
        if meta is None:
            ttl, model, topology, group = cast(
                list[bytes | None],
                await self._redis.hmget(
                    self._keys.session(session_id).doc, ["ttl_seconds", "model", "topology", "group"]
                ),
            )
            meta = AppendMeta(
                int(ttl or 0),
                (model or b"").decode(),
                Topology(int(topology or Topology.SHARED)),
                (group or b"").decode(),
            )
            if ttl is not None:
                if len(self._meta) > _MAX_SESSIONS:
                    self._meta.clear()
                self._meta[session_id] = meta
        return meta

    async def bump_deadline(self, session_id: str, deadline_ms: int, ttl_s: int) -> None:
        """Keeps the sweeper's deadline index roughly current without a write per append: the entry moves
        only once a tenth of the TTL has passed since it was last moved. An entry may therefore be early,
        never late; the sweeper confirms with the ``alive`` key (which every append refreshes exactly)
        before it ends a session."""
        last = self._deadline.get(session_id, 0)
        if deadline_ms - last < ttl_s * 100:
            return
        if len(self._deadline) > _MAX_SESSIONS:
            self._deadline.clear()
        self._deadline[session_id] = deadline_ms
        # The append script has just proved the session exists; a session revived after expiry
        # re-enters the index here.
        await self._redis.zadd(self._keys.deadlines(), {session_id: deadline_ms})

    def document_changed(self, session_id: str) -> None:
        """The document's fields may differ now (UpdateSession, retirement, another sidecar's timeout)."""
        self._meta.pop(session_id, None)

    def deadline_moved(self, session_id: str) -> None:
        """The index entry was rewritten elsewhere (a new timeout): the next append writes it again."""
        self._deadline.pop(session_id, None)

    def forget(self, session_id: str) -> None:
        """The session is gone (erasure): nothing of it is remembered."""
        self._meta.pop(session_id, None)
        self._deadline.pop(session_id, None)


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


# ---------------------------------------------------------------- the append path's retry policy


class AppendRetries:
    """The append path's one retry policy (AppendMessages): which refusals of an append are sent again,
    how often, and why. The append script checks everything before it writes, so a refused batch left
    nothing behind and sending it again is safe; any other failure is the call's answer.

    - ``NOSCRIPT``: Redis lost its script cache (a fresh, restarted or failed-over server). The script
      is loaded and the same command sent again at once: ``SCRIPT_RELOADS`` per send.
    - ``TTL <ms>``: the inactivity timeout this process remembered (``AppendMemo``) is not the
      document's (another sidecar's UpdateSession changed it). The memo forgets the session and the batch
      goes again with the timeout Redis named: ``SENDS_PER_BATCH`` sends, then UNAVAILABLE (the timeout
      kept changing; the caller retries).
    - ``EXPIRED``: new messages for an expired session. AppendMessages takes the session up again
      (``revive``: ACTIVE with its RESUMED event) and builds the batch again (an attempt fills in ids,
      times and defaults, and the stored fingerprint must be the caller's batch as sent): ``BATCHES``
      batches, then UNAVAILABLE (it kept expiring between revival and append). Without ``revive`` (any
      other writer) the refusal is the answer: SessionExpired.
    """

    SCRIPT_RELOADS = 1
    SENDS_PER_BATCH = 3
    BATCHES = 3


@dataclass(slots=True)
class _Batch:
    """A batch made ready to send: its messages (ids, times, defaults and token counts filled in) and
    the append script's keys and arguments (``args[1]``: the timeout in ms the batch is sent with)."""

    messages: list[Message]
    token_counts: list[int]
    keys: list[str]
    args: list[Any]
    now: int
    ttl_s: int


class SessionMessages:
    def __init__(
        self,
        redis: aioredis.Redis,
        keys: KeySpace,
        tokens: TokenCounter,
        limits: Limits,
        memo: AppendMemo,
        *,
        executor: Executor | None = None,
        durability: Durability | None = None,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.tokens = tokens
        self.limits = limits
        self._memo = memo  # its one owner: the others only say what changed
        self._executor = executor
        self._durability = durability  # None: no replica acknowledgement asked for
        self._append = redis.register_script(scripts.APPEND)
        self._read = redis.register_script(scripts.READ_RANGE)

    async def _hot(self, *command: Any) -> Any:
        """One command of a hot path through the client's pipelined lane (``infra/redis_lane.py``)."""
        return await hot(self.redis, *command)

    async def append(
        self, session_id: str, messages: list[Message], writer: Caller = UNRESTRICTED, model: str = ""
    ) -> AppendOutcome:
        """Appends a batch atomically. Ids left empty are generated; tokens are counted here, once.
        Messages without a visibility get the session topology's default; ``writer`` may only write as
        itself and into its own groups. An expired session is refused (SessionExpired)."""
        return await self._append_retrying(session_id, lambda: messages, writer, model, revive=None)

    async def append_reviving(
        self,
        session_id: str,
        build: Callable[[], list[Message]],
        writer: Caller,
        revive: Callable[[str], Awaitable[Any]],
    ) -> AppendOutcome:
        """AppendMessages: ``append`` of the batch ``build`` makes, an expired session taken up again with
        ``revive`` and the batch built afresh for it (``AppendRetries`` says how often)."""
        return await self._append_retrying(session_id, build, writer, "", revive=revive)

    async def _append_retrying(
        self,
        session_id: str,
        build: Callable[[], list[Message]],
        writer: Caller,
        model: str,
        *,
        revive: Callable[[str], Awaitable[Any]] | None,
    ) -> AppendOutcome:
        """The append path under ``AppendRetries``, in one loop: every refusal the policy retries is
        handled here and nowhere else."""
        batch: _Batch | None = None
        batches = sends = reloads = 0
        while True:
            if batch is None:  # the first batch, or one built again after a revival
                batch = await self._prepare(session_id, build(), writer, model)
                batches, sends = batches + 1, 0
            try:
                out = await self._send(batch)
            except NoScriptError as exc:
                if reloads >= AppendRetries.SCRIPT_RELOADS:
                    raise script_error(exc, session_id) from exc
                reloads += 1
                await self.redis.script_load(scripts.APPEND)
                continue
            except ResponseError as exc:
                reloads = 0
                if str(exc).startswith("TTL "):
                    sends += 1
                    self._memo.document_changed(session_id)
                    batch.args[1] = int(float(str(exc).split(" ", 1)[1]))
                    batch.ttl_s = batch.args[1] // 1000
                    if sends >= AppendRetries.SENDS_PER_BATCH:
                        raise Unavailable(
                            f"session {session_id!r}: its timeout kept changing under the append; retry"
                        ) from exc
                    continue
                error = script_error(exc, session_id)
                if not isinstance(error, SessionExpired) or revive is None:
                    raise error from exc
                await revive(session_id)  # new messages for an expired session: taken up again, with RESUMED
                if batches >= AppendRetries.BATCHES:
                    raise Unavailable(
                        f"session {session_id!r} kept expiring under the append; retry"
                    ) from exc
                batch = None
                continue
            if batch.ttl_s > 0:
                await self._memo.bump_deadline(session_id, batch.now + batch.ttl_s * 1000, batch.ttl_s)
            return self._outcome(batch, out)

    async def _prepare(self, session_id: str, messages: list[Message], writer: Caller, model: str) -> _Batch:
        """Fills in what the caller left out (ids, times, the topology's visibility), checks the batch,
        counts its tokens and builds the script's arguments."""
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
                m.visibility, default_group = DEFAULT_VISIBILITY[meta.topology], meta.group
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
        return _Batch(messages, counts, [k.doc, k.messages, k.order, k.alive], args, now, ttl_s)

    async def _send(self, batch: _Batch) -> Any:
        """One EVALSHA, sent as a bare command: redis-py's Script and pipeline wrappers cost more than the
        round trip itself. With replicas asked for, EVALSHA + WAIT on one connection. No retry here: a
        refusal is ``_append_retrying``'s."""
        sha, keys, args = self._append.sha, batch.keys, batch.args
        if self._durability is not None:
            return await self._durability.send(self.redis, sha, keys, args)
        return await self._hot("EVALSHA", sha, len(keys), *keys, *args)

    @staticmethod
    def _outcome(batch: _Batch, out: Any) -> AppendOutcome:
        seqs = [int(x) for x in out[2::2]]
        dups = [bool(int(x)) for x in out[3::2]]
        for m, seq in zip(batch.messages, seqs, strict=True):
            m.seq = seq
        return AppendOutcome(
            seqs=seqs,
            token_counts=batch.token_counts,
            duplicates=dups,
            message_ids=[m.message_id for m in batch.messages],
            token_total=int(out[0]),
            message_count=int(out[1]),
        )

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
            raise script_error(exc, session_id) from exc
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
            more = len(out) == size or scanned >= SCAN_BUDGET  # a short page; the token resumes the scan
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
