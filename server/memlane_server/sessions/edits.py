"""Editing one stored message in place (UpdateMessage): a guardrail's redaction, a framework's
``update_message``.

Only what a message *says* may change (content, native object, metadata, tool call ids); its id, seq,
role, author, visibility and time stay, so an edit can never move a message into another scope. The
caller must be one that could have written the message (``Caller.check_write``, the RemoveMessages
rule). Python reads the message, checks the caller and builds the new payload; one Lua script then
swaps it in only if the stored payload is still the one that was read (so the access check and the
token delta hold for what is replaced), adjusts the token total and resets a summary that covered the
message, as a removal does. The 16-character fingerprint in front of the payload stays the original
append's: a retried append of the original is still a duplicate and does not undo the edit.

Removing a session's messages: by id, the last N ("pop") or all ("clear").

One Lua script (scripts.REMOVE) does the removal, the totals, the summary reset and the idempotency
record atomically. Python reads what is about to go first, for two reasons: the script needs each
message's token count, and a restricted caller may only remove messages it could have written
(``Caller.check_write``, the same rule as an append). For "last N" the ids are the last N at read
time; a message appended between the read and the script is left alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from ..access.identity import UNRESTRICTED, Caller
from ..errors import Conflict, InvalidArgument, NotFound
from ..ids import check_id
from ..keyspace import KeySpace
from . import scripts
from .codec import FINGERPRINT_LEN, decode_message, encode_message
from .limits import check_batch
from .model import Message
from .scripts import script_error
from .store import SessionStore, now_ms

EDITABLE = frozenset({"content", "native", "metadata", "tool_call_ids"})
_ATTEMPTS = 5  # compare-and-set rounds before giving up (each lost only to a concurrent edit)

# KEYS: doc, msgs, order.  ARGV: message_id, payload read, new payload, token delta.
# Returns {changed (0/1), token_total}; errors NOTFOUND (session), GONE (message), CHANGED (payload no
# longer the one read). The summary reset is the one of REMOVE (sessions/scripts.py): a summary, and its
# per-scope parts, that covered the old text must not outlive it.
EDIT = r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOTFOUND') end
local cur = redis.call('HGET', KEYS[2], ARGV[1])
if not cur then return redis.error_reply('GONE') end
if cur ~= ARGV[2] then return redis.error_reply('CHANGED') end
if ARGV[3] == ARGV[2] then
  return {0, tonumber(redis.call('HGET', KEYS[1], 'token_total') or '0')}
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local total = redis.call('HINCRBY', KEYS[1], 'token_total', tonumber(ARGV[4]))
local seq = tonumber(redis.call('ZSCORE', KEYS[3], ARGV[1]) or '0')
if seq <= tonumber(redis.call('HGET', KEYS[1], 'summary_through_seq') or '0') then
  redis.call('HSET', KEYS[1], 'summary_text', '', 'summary_through_id', '', 'summary_through_seq', 0,
    'summary_tokens', 0, 'summary_scoped', '')
end
return {1, total}
"""


@dataclasses.dataclass(slots=True)
class EditOutcome:
    message: Message
    token_total: int
    changed: bool


class MessageEditor:
    def __init__(self, redis: aioredis.Redis, keys: KeySpace, store: SessionStore) -> None:
        self._redis = redis
        self._keys = keys
        self._store = store
        self._edit = redis.register_script(EDIT)

    async def edit(
        self,
        session_id: str,
        message_id: str,
        changes: Message,
        paths: list[str],
        caller: Caller = UNRESTRICTED,
    ) -> EditOutcome:
        """Sets the fields named in ``paths`` of the stored message ``message_id`` to those of
        ``changes``."""
        check_id(session_id, "session_id")
        check_id(message_id, "message.message_id")
        if not paths:
            raise InvalidArgument("update_mask must name at least one field")
        unknown = sorted(set(paths) - EDITABLE)
        if unknown:
            raise InvalidArgument(
                f"update_mask path {unknown[0][:64]!r} is not editable (one of {', '.join(sorted(EDITABLE))})"
            )
        session = await self._store.get(session_id)  # NOT_FOUND for an unknown session, before all else
        k = self._keys.session(session_id)
        for _ in range(_ATTEMPTS):
            raw = cast(bytes | None, await self._redis.hget(k.messages, message_id))
            if raw is None or len(raw) <= FINGERPRINT_LEN:
                raise NotFound(f"message {message_id!r} not found in session {session_id!r}")
            old = decode_message(session_id, message_id, 0, raw)
            caller.check_write(
                int(old.visibility), old.source_agent_id, old.visibility_group, f"message {message_id!r}"
            )
            new = self._apply(old, changes, paths)
            check_batch([new], self._store.limits, now_ms())
            new.token_count = self._store.tokens.count_many([new.content], session.model)[0]
            payload = raw[:FINGERPRINT_LEN] + encode_message(new)
            try:
                changed, total = await self._edit(
                    keys=[k.doc, k.messages, k.order],
                    args=[message_id, raw, payload, new.token_count - old.token_count],
                )
            except ResponseError as exc:
                word = str(exc).split(" ", 1)[0]
                if word == "CHANGED":
                    continue  # another edit landed between the read and the script: read again
                if word == "GONE":
                    raise NotFound(f"message {message_id!r} not found in session {session_id!r}") from exc
                raise script_error(exc, session_id) from exc
            new.seq = int(await self._redis.zscore(k.order, message_id) or 0)
            return EditOutcome(new, int(total), bool(changed))
        raise Conflict(f"message {message_id!r} kept changing during the edit; retry")

    @staticmethod
    def _apply(old: Message, changes: Message, paths: list[str]) -> Message:
        fields: dict[str, Any] = {}
        for path in paths:
            if path == "native":
                fields["native_format"], fields["native_json"] = changes.native_format, changes.native_json
            else:
                fields[path] = getattr(changes, path)
        return dataclasses.replace(old, **fields)


# ---------------------------------------- removing messages (see the module docstring)

MAX_REMOVE = 1000  # ids per call, and N of "last N"
# How long a request id's answer (with the removed messages, for a retried "pop") is kept.
ANSWER_TTL_MS = 3_600_000


@dataclass(slots=True)
class RemoveOutcome:
    removed: list[Message]  # oldest first; empty for "all"
    removed_count: int
    token_total: int
    message_count: int


class MessageRemover:
    def __init__(self, redis: aioredis.Redis, keys: KeySpace, store: SessionStore) -> None:
        self._redis = redis
        self._keys = keys
        self._store = store
        self._remove = redis.register_script(scripts.REMOVE)

    async def remove(
        self,
        session_id: str,
        request_id: str,
        *,
        message_ids: list[str] | None = None,
        last: int = 0,
        everything: bool = False,
        caller: Caller = UNRESTRICTED,
    ) -> RemoveOutcome:
        check_id(session_id, "session_id")
        check_id(request_id, "request_id")
        ids = message_ids or []
        if sum((bool(ids), last != 0, everything)) != 1:
            raise InvalidArgument("set exactly one of message_ids, last and all")
        if last < 0 or last > MAX_REMOVE:
            raise InvalidArgument(f"last must be between 1 and {MAX_REMOVE}")
        if len(ids) > MAX_REMOVE:
            raise InvalidArgument(f"message_ids holds more than {MAX_REMOVE} ids")
        for i, mid in enumerate(ids):
            check_id(mid, f"message_ids[{i}]")
        if everything:
            if not caller.unrestricted:
                async for m in self._store.all_messages(session_id):
                    self._check(caller, m)
            return self._replayable(caller, await self._run(session_id, request_id, "all", []))
        doomed = await self._store.tail(session_id, last) if last else await self._by_ids(session_id, ids)
        for m in doomed:
            self._check(caller, m)
        args: list[Any] = []
        for m in doomed:
            args += [m.message_id, m.token_count]
        return self._replayable(caller, await self._run(session_id, request_id, "ids", args))

    @classmethod
    def _replayable(cls, caller: Caller, out: RemoveOutcome) -> RemoveOutcome:
        """A request id already answered replays its stored answer whatever this call named or which
        mode it asked for: the caller gets it only if it could have removed every message in it (a retry
        by the remover), never another agent's private turns through a guessed or reused request id."""
        for m in out.removed:
            cls._check(caller, m)
        return out

    @staticmethod
    def _check(caller: Caller, m: Message) -> None:
        caller.check_write(
            int(m.visibility), m.source_agent_id, m.visibility_group, f"message {m.message_id!r}"
        )

    async def _by_ids(self, session_id: str, ids: list[str]) -> list[Message]:
        await self._store.get(session_id)  # NOT_FOUND for an unknown session, before anything else
        rows = cast(list[bytes | None], await self._redis.hmget(self._keys.session(session_id).messages, ids))
        return [
            decode_message(session_id, mid, 0, raw)
            for mid, raw in zip(ids, rows, strict=True)
            if raw is not None and len(raw) > FINGERPRINT_LEN
        ]

    async def _run(self, session_id: str, request_id: str, mode: str, pairs: list[Any]) -> RemoveOutcome:
        k = self._keys.session(session_id)
        try:
            out = await self._remove(
                keys=[k.doc, k.messages, k.order, self._keys.removals(session_id), k.traces, k.trace_data],
                args=[request_id, mode, ANSWER_TTL_MS, *pairs],
            )
        except ResponseError as exc:
            raise script_error(exc, session_id) from exc
        flat = out[3]
        removed = [
            decode_message(session_id, flat[i + 1].decode(), int(flat[i]), flat[i + 2])
            for i in range(0, len(flat), 3)
        ]
        removed.sort(key=lambda m: m.seq)
        return RemoveOutcome(removed, int(out[0]), int(out[1]), int(out[2]))
