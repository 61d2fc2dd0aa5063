"""Lua scripts: each runs atomically inside Redis and touches only one session's keys (one hash slot).
Beside them, what their refusals mean to the API (``script_error``: every store that runs a script on a
session's slot maps its error words here), and how a write script is confirmed by replicas
(``Durability``).

Replica acknowledgement for acknowledged writes (``redis_wait_replicas``).

Redis replicates asynchronously: a master that dies right after answering may take the last writes with
it, and its promoted replica never saw them. With ``replicas > 0`` a write script is followed by ``WAIT
replicas timeout`` **on the same connection** (WAIT counts the replication offset of that connection's
writes, so it must share the pipeline; on Redis Cluster both commands go to the node owning the session's
slot). If fewer replicas confirm within the timeout the write is reported UNAVAILABLE: it happened on the
master and may or may not survive a failover, and a retry with the same message ids is idempotent.
Replication is in order, so a later confirmed write also confirms every earlier one on that master.

On Redis Cluster every failure of a durable write also refreshes the client's slot map (at most once per
``_REFRESH_EVERY_S``): after a failover the map may still name the old master, which came back as a
replica, so the EVALSHA is redirected to the new master while the WAIT, sent to the node the map named,
counts a replica's confirmations: without a refresh every retry met the same stale map (durable appends
answered UNAVAILABLE for a minute once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from string import Template
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import NoScriptError, ResponseError

from ..errors import AlreadyExists, Conflict, FailedPrecondition, NotFound, SessionExpired, Unavailable
from .model import PromotionState, SessionStatus


def fill_statuses(lua: str) -> str:
    """Fills ``$CLOSED``, ``$P_ARCHIVED`` ... with the stored digits of the enums, so a script and the
    Python code can never disagree about a status."""
    names = {s.name: str(int(s)) for s in SessionStatus}
    names |= {f"P_{p.name}": str(int(p)) for p in PromotionState}
    return Template(lua).substitute(names)


def script_error(exc: ResponseError, session_id: str) -> Exception:
    """The API's error for a script's refusal (its first word: NOTFOUND, CLOSED, EXPIRED, CONFLICT <id>,
    ILLEGAL <status>, ALIVE, STALE); any other reply is returned as it came."""
    msg = str(exc)
    word = msg.split(" ", 1)[0]
    if word == "NOTFOUND":
        return NotFound(f"session {session_id!r} not found")
    if word == "CLOSED":
        return FailedPrecondition(f"session {session_id!r} is closed; start a new session")
    if word == "EXPIRED":
        return SessionExpired(f"session {session_id!r} has expired; resume it first")
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


# KEYS: doc.  ARGV: field/value pairs.  Creates the document unless it exists; 1 if it created it.
CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""

# Status codes as stored in the document (memlane.v1.SessionStatus values).
# KEYS: doc, msgs, order, alive.  ARGV: now_ms, ttl_ms, count, then (id, fingerprint, payload, tokens) each.
# Returns {token_total, message_count, seq_1, dup_1, seq_2, dup_2, ...}.
# Refuses with NOTFOUND, CLOSED, CONFLICT <id>, EXPIRED (new messages for an expired session) or TTL <ms>
# (ARGV's ttl_ms is not the document's).
# A batch lands whole or not at all: every id is checked before anything is written.
APPEND = fill_statuses(
    """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return redis.error_reply('NOTFOUND') end
if status == '$CLOSED' then return redis.error_reply('CLOSED') end
local n = tonumber(ARGV[3])
local seqs = {}
for i = 0, n - 1 do
  local id = ARGV[4 + i * 4]
  local existing = redis.call('HGET', KEYS[2], id)
  if existing then
    if string.sub(existing, 1, 16) ~= ARGV[5 + i * 4] then
      return redis.error_reply('CONFLICT ' .. id)
    end
    seqs[i + 1] = tonumber(redis.call('ZSCORE', KEYS[3], id))
  end
end
-- An expired session takes new messages only once resumed (its RESUMED event: Resumer.revive);
-- a retried batch stored before the expiry is answered as duplicates and revives nothing.
if status == '$EXPIRED' then
  for i = 1, n do if not seqs[i] then return redis.error_reply('EXPIRED') end end
end
-- The document's timeout wins over the caller's, read from a per-process cache that another sidecar's
-- UpdateSession may have outdated: the caller reloads it and sends the batch again.
local doc_ttl = tonumber(redis.call('HGET', KEYS[1], 'ttl_seconds') or '0') * 1000
if doc_ttl ~= tonumber(ARGV[2]) then return redis.error_reply('TTL ' .. doc_ttl) end
local seq = tonumber(redis.call('HGET', KEYS[1], 'last_seq') or '0')
local tokens, added = 0, 0
local out = {0, 0}
for i = 0, n - 1 do
  local base = 4 + i * 4
  if seqs[i + 1] then
    out[#out + 1] = seqs[i + 1]
    out[#out + 1] = 1
  else
    seq = seq + 1
    redis.call('HSET', KEYS[2], ARGV[base], ARGV[base + 1] .. ARGV[base + 2])
    redis.call('ZADD', KEYS[3], seq, ARGV[base])
    tokens = tokens + tonumber(ARGV[base + 3])
    added = added + 1
    seqs[i + 1] = seq
    out[#out + 1] = seq
    out[#out + 1] = 0
  end
end
if added > 0 then
  redis.call('HSET', KEYS[1], 'last_seq', seq, 'last_activity_at_ms', ARGV[1])
  if status ~= '$ACTIVE' then redis.call('HSET', KEYS[1], 'status', '$ACTIVE') end
  local ttl = tonumber(ARGV[2])
  if ttl > 0 then redis.call('SET', KEYS[4], '1', 'PX', ttl) end
end
out[1] = redis.call('HINCRBY', KEYS[1], 'token_total', tokens)
out[2] = redis.call('HINCRBY', KEYS[1], 'message_count', added)
return out
"""
)

# KEYS: doc, order, msgs.  ARGV: min, max (ZRANGEBYSCORE bounds on seq), count, reverse (0/1), then
# optionally names of document fields to read in the same step.
# Returns {field values..., seq_1, id_1, payload_1, ...}; NOTFOUND when the session does not exist.
READ_RANGE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOTFOUND') end
local out = {}
if #ARGV > 4 then out = redis.call('HMGET', KEYS[1], unpack(ARGV, 5)) end
local ids
if ARGV[4] == '1' then
  ids = redis.call('ZREVRANGEBYSCORE', KEYS[2], ARGV[2], ARGV[1], 'WITHSCORES', 'LIMIT', 0, ARGV[3])
else
  ids = redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[1], ARGV[2], 'WITHSCORES', 'LIMIT', 0, ARGV[3])
end
for i = 1, #ids, 2 do
  out[#out + 1] = ids[i + 1]
  out[#out + 1] = ids[i]
  out[#out + 1] = redis.call('HGET', KEYS[3], ids[i]) or ''
end
return out
"""

# Lifecycle events written by the script that changes the state (sessions/events.py). A script's event
# ARGV, from index ``base``: uid ('' = no event), type, session_id, at_ms, detail JSON, fence_ms.
# ``event_fenced`` must be checked before the first write (a script's error undoes nothing).
EVENT_LIB = r"""
local function event_fenced(base)
  if ARGV[base] == '' then return false end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[base + 5])
end
local function event_push(outbox, doc, base)
  if ARGV[base] == '' then return end
  local f = redis.call('HMGET', doc, 'user_id', 'channel', 'status', 'promotion_state')
  redis.call('RPUSH', outbox, cjson.encode({ARGV[base], ARGV[base + 1], ARGV[base + 2], f[1] or '',
    f[2] or '', f[3] or '', f[4] or '', ARGV[base + 3], ARGV[base + 4]}))
end
"""

# KEYS: doc, alive, outbox.  ARGV: to_status, timestamp field ('' for none), now_ms, allowed from-statuses
# (csv), from-statuses that write the event (csv), then the event (base 6).
# Returns the previous status; NOTFOUND / ILLEGAL <from> / ALIVE (expiring a revived session) / FENCE on
# failure. Reaching CLOSED or EXPIRED drops the activity key so no expiry event fires for an ended session.
TRANSITION = EVENT_LIB + fill_statuses(
    r"""
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return redis.error_reply('NOTFOUND') end
if status == ARGV[1] then return status end
-- Expiry only wins if the activity key is still gone: an append between the expiry event and this
-- script revived the session.
if ARGV[1] == '$EXPIRED' and redis.call('EXISTS', KEYS[2]) == 1 then return redis.error_reply('ALIVE') end
local allowed, emit = false, false
for s in string.gmatch(ARGV[4], '[^,]+') do
  if s == status then allowed = true end
end
if not allowed then return redis.error_reply('ILLEGAL ' .. status) end
for s in string.gmatch(ARGV[5], '[^,]+') do
  if s == status then emit = true end
end
if emit and event_fenced(6) then return redis.error_reply('FENCE') end
redis.call('HSET', KEYS[1], 'status', ARGV[1])
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], ARGV[2], ARGV[3]) end
if ARGV[1] == '$CLOSED' or ARGV[1] == '$EXPIRED' then redis.call('DEL', KEYS[2]) end
if emit then event_push(KEYS[3], KEYS[1], 6) end
return status
"""
)

# KEYS: doc.  ARGV: expected through_seq, expected message_count - last_seq ('' = any), then field/value
# pairs of the new summary.
# Compare-and-set so a summary computed from an old view never overwrites a newer one. An append moves
# message_count and last_seq together; only a removal changes their difference, so a summary whose turns
# were read before a removal (it may hold a removed turn) is refused too.
SET_SUMMARY = """
local cur = redis.call('HGET', KEYS[1], 'summary_through_seq')
if cur == false and redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOTFOUND') end
if (tonumber(cur) or 0) ~= tonumber(ARGV[1]) then return redis.error_reply('STALE ' .. (cur or '0')) end
if ARGV[2] ~= '' then
  local t = redis.call('HMGET', KEYS[1], 'message_count', 'last_seq')
  if (tonumber(t[1]) or 0) - (tonumber(t[2]) or 0) ~= tonumber(ARGV[2]) then
    return redis.error_reply('STALE ' .. (cur or '0'))
  end
end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
return 1
"""

# KEYS: doc, outbox.  ARGV: new state, allowed current states (csv; '' = any), then the event (base 3),
# written only when the state changes.
SET_PROMOTION = (
    EVENT_LIB
    + r"""
local cur = redis.call('HGET', KEYS[1], 'promotion_state')
if not cur then return redis.error_reply('NOTFOUND') end
if ARGV[2] ~= '' then
  local ok = false
  for s in string.gmatch(ARGV[2], '[^,]+') do if s == cur then ok = true end end
  if not ok then return redis.error_reply('ILLEGAL ' .. cur) end
end
if cur == ARGV[1] then return cur end
if event_fenced(3) then return redis.error_reply('FENCE') end
redis.call('HSET', KEYS[1], 'promotion_state', ARGV[1])
event_push(KEYS[2], KEYS[1], 3)
return cur
"""
)

# KEYS: doc, msgs, order, traces, tracedata, outbox.  ARGV: archived through-seq, then the RETIRED event
# (base 2), then the stub's lifecycle field/value pairs (from 8; sessions/codec.py).  Drops the hot data
# only if the session is still ended, archived, and has nothing newer than the archive; 1 if it did.
RETIRE = EVENT_LIB + fill_statuses(
    r"""
local st = redis.call('HMGET', KEYS[1], 'status', 'last_seq', 'promotion_state')
if not st[1] then return 0 end
if (st[1] ~= '$CLOSED' and st[1] ~= '$EXPIRED') or st[3] ~= '$P_ARCHIVED' then return 0 end
if tonumber(st[2]) ~= tonumber(ARGV[1]) then return 0 end
if event_fenced(2) then return redis.error_reply('FENCE') end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
redis.call('HDEL', KEYS[1], 'extra')
redis.call('HSET', KEYS[1], unpack(ARGV, 8))
event_push(KEYS[6], KEYS[1], 2)
return 1
"""
)

# KEYS: doc, outbox.  ARGV: the event (base 1), the lifecycle fields to delete (space-separated), then
# field/value pairs to set (from 8).  Rewrites the lifecycle's fields (resumption's last step); the
# document's old single ``extra`` field goes too (sessions/codec.py migrates it on read).
SET_LIFECYCLE = (
    EVENT_LIB
    + r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOTFOUND') end
if event_fenced(1) then return redis.error_reply('FENCE') end
redis.call('HDEL', KEYS[1], 'extra')
for f in string.gmatch(ARGV[7], '[^ ]+') do redis.call('HDEL', KEYS[1], f) end
if #ARGV > 7 then redis.call('HSET', KEYS[1], unpack(ARGV, 8)) end
event_push(KEYS[2], KEYS[1], 1)
return 1
"""
)

# --- turn traces (sessions/traces.py)

# KEYS: trace_data, traces. ARGV: trace id, payload, created_at_ms, cap. One round trip: store, index,
# and drop the oldest traces beyond the cap (payload and index entry together).
PUT_TRACE = """
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
if excess > 0 then
  local stale = redis.call('ZRANGE', KEYS[2], 0, excess - 1)
  redis.call('HDEL', KEYS[1], unpack(stale))
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, excess - 1)
end
return 1
"""

# --- the session-end queue (sessions/ending.py); keys on the queue's slot

# KEYS: parked stream, queue stream, failures, queue outbox.  ARGV: job id, group, outbox entry JSON ('' =
# none; its detail gains ``parked_id``), then the parked entry's field/value pairs.  Moves a job off the
# queue into the parked stream with its PARKED event; returns the parked id.
PARK = r"""
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 4))
redis.call('XACK', KEYS[2], ARGV[2], ARGV[1])
redis.call('XDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
if ARGV[3] ~= '' then
  local e = cjson.decode(ARGV[3])
  local d = cjson.decode(e[9])
  d['parked_id'] = id
  e[9] = cjson.encode(d)
  redis.call('RPUSH', KEYS[4], cjson.encode(e))
end
return id
"""

# --- the events stream (sessions/events.py); keys on the stream's slot

# KEYS: events stream, relayed ids.  ARGV: uid, now_ms, window_ms, max_len, then stream field/value pairs.
# Appends the event unless its id was relayed already; 1 if it appended.
RELAY = r"""
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[4], '*', unpack(ARGV, 5))
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', tonumber(ARGV[2]) - tonumber(ARGV[3]))
return 1
"""

# KEYS: outbox_due.  ARGV: session id, the score it was read with.  Drops the entry unless a writer
# reserved it again since (a new score).
FORGET_DUE = r"""
local cur = redis.call('ZSCORE', KEYS[1], ARGV[1])
if cur and tonumber(cur) == tonumber(ARGV[2]) then return redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0
"""

# --- message removal (sessions/edits.py)

# KEYS: doc, msgs, order, removals, traces, trace_data.  ARGV: request_id, mode ('ids' | 'all'),
# answer TTL (ms), then (message_id, token_count) pairs for 'ids'.
# Returns {count, token_total, message_count, {seq_1, id_1, payload_1, ...}}. A request id seen before
# returns its first answer (the removed messages kept for the answer TTL) and changes nothing.
# `last_seq` is never touched, so seqs stay monotonic; a summary covering a removed seq is reset, its
# per-scope parts with it (a removed private turn must not live on in its scope's summary).
REMOVE = r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOTFOUND') end
local rid = ARGV[1]
local head = redis.call('HGET', KEYS[4], rid)
if head then
  local totals = redis.call('HMGET', KEYS[1], 'token_total', 'message_count')
  if string.sub(head, 1, 1) == 'A' then
    return {tonumber(string.sub(head, 2)), tonumber(totals[1] or '0'), tonumber(totals[2] or '0'), {}}
  end
  local n = tonumber(head)
  local fields = {}
  for i = 1, n do fields[i] = rid .. '\0' .. i end
  local rows = {}
  if n > 0 then rows = redis.call('HMGET', KEYS[4], unpack(fields)) end
  local flat = {}
  for _, r in ipairs(rows) do
    if r then
      local a = string.find(r, '\0', 1, true)
      local b = string.find(r, '\0', a + 1, true)
      flat[#flat + 1] = string.sub(r, 1, a - 1)
      flat[#flat + 1] = string.sub(r, a + 1, b - 1)
      flat[#flat + 1] = string.sub(r, b + 1)
    end
  end
  return {n, tonumber(totals[1] or '0'), tonumber(totals[2] or '0'), flat}
end
local flat, count, tokens, lowest = {}, 0, 0, nil
if ARGV[2] == 'all' then
  count = redis.call('ZCARD', KEYS[3])
  redis.call('DEL', KEYS[2], KEYS[3], KEYS[5], KEYS[6])
  redis.call('HSET', KEYS[1], 'token_total', 0, 'message_count', 0)
  lowest = 0
else
  for i = 4, #ARGV, 2 do
    local id = ARGV[i]
    local payload = redis.call('HGET', KEYS[2], id)
    if payload then
      local seq = tonumber(redis.call('ZSCORE', KEYS[3], id) or '0')
      redis.call('HDEL', KEYS[2], id)
      redis.call('ZREM', KEYS[3], id)
      count = count + 1
      tokens = tokens + tonumber(ARGV[i + 1])
      flat[#flat + 1] = seq
      flat[#flat + 1] = id
      flat[#flat + 1] = payload
      redis.call('HSET', KEYS[4], rid .. '\0' .. count, seq .. '\0' .. id .. '\0' .. payload)
      if lowest == nil or seq < lowest then lowest = seq end
    end
  end
  if count > 0 then
    redis.call('HINCRBY', KEYS[1], 'token_total', -tokens)
    redis.call('HINCRBY', KEYS[1], 'message_count', -count)
  end
end
if lowest ~= nil and lowest <= tonumber(redis.call('HGET', KEYS[1], 'summary_through_seq') or '0') then
  redis.call('HSET', KEYS[1], 'summary_text', '', 'summary_through_id', '', 'summary_through_seq', 0,
    'summary_tokens', 0, 'summary_scoped', '')
end
if ARGV[2] == 'all' then
  redis.call('HSET', KEYS[4], rid, 'A' .. count)
else
  redis.call('HSET', KEYS[4], rid, count)
end
redis.call('PEXPIRE', KEYS[4], ARGV[3])
local totals = redis.call('HMGET', KEYS[1], 'token_total', 'message_count')
return {count, tonumber(totals[1] or '0'), tonumber(totals[2] or '0'), flat}
"""


# ---------------------------------------- replica acknowledgement (durability) (see the module docstring)

log = logging.getLogger("memlane")


_REFRESH_EVERY_S = 0.5
# Replies that say the slot map is wrong or changing (the script's own refusals, NOTFOUND and the like,
# say nothing about the topology).
_TOPOLOGY_REPLIES = ("MOVED", "ASK", "READONLY", "CLUSTERDOWN", "TRYAGAIN", "NOREPLICAS", "LOADING")


def _topology(exc: BaseException) -> bool:
    if isinstance(exc, NoScriptError):
        return False
    if isinstance(exc, ResponseError):
        return str(exc).startswith(_TOPOLOGY_REPLIES)
    return True  # ours (too few replicas, the slot moved), a lost connection, a timeout, a cluster error


@dataclass(frozen=True, slots=True)
class Durability:
    # From the settings redis_wait_replicas and redis_wait_timeout_ms (wiring/), which hold the defaults.
    replicas: int  # 0: answer as soon as the master has the write (Redis's default)
    timeout_ms: int
    _refreshed_at: list[float] = field(default_factory=lambda: [0.0], compare=False, repr=False)

    async def evalsha(
        self, redis: aioredis.Redis, script: str, sha: str, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        """EVALSHA, then WAIT when replicas are asked for; loads the script on NOSCRIPT (nothing ran)."""
        for attempt in (0, 1):
            try:
                return await self.send(redis, sha, keys, args)
            except NoScriptError:
                if attempt:
                    raise
                await redis.script_load(script)
        raise AssertionError("unreachable")

    async def send(self, redis: aioredis.Redis, sha: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """EVALSHA, then WAIT, once: a NOSCRIPT is the caller's to handle (``evalsha`` loads the script and
        sends again; the append path's retry policy does the same, ``messages.AppendRetries``)."""
        if not isinstance(redis, RedisCluster):
            return await self._confirmed(redis, None, sha, keys, args)
        try:
            return await self._confirmed(redis, redis, sha, keys, args)
        except Exception as exc:
            if _topology(exc):
                await self._refresh(redis)
            raise

    async def _refresh(self, cluster: RedisCluster) -> None:
        """Re-reads the slot map (nodes and roles) from the cluster, unless done a moment ago."""
        now = time.monotonic()
        if now - self._refreshed_at[0] < _REFRESH_EVERY_S:
            return
        self._refreshed_at[0] = now
        try:
            await cluster.nodes_manager.initialize()
        except Exception:  # the cluster is still electing: the next failure asks again
            log.warning("could not refresh the Redis Cluster slot map", exc_info=True)

    async def _confirmed(
        self,
        redis: aioredis.Redis,
        cluster: RedisCluster | None,
        sha: str,
        keys: Sequence[str],
        args: Sequence[Any],
    ) -> Any:
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
