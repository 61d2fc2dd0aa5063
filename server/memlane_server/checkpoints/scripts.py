"""Lua scripts of the framework checkpoints (checkpoints/store.py): each runs atomically inside Redis and
touches only one session's keys (one hash slot)."""

from __future__ import annotations

from ..sessions.scripts import fill_statuses

# Whether the document is a retired stub: its ``retired_at_ms`` field (sessions/codec.py), or, on a
# document written before that field, the same key inside its old single JSON field ``extra``.
RETIRED_LIB = r"""
local function is_retired(doc)
  local r = redis.call('HMGET', doc, 'retired_at_ms', 'extra')
  if r[1] and r[1] ~= '' and r[1] ~= '0' then return true end
  return r[2] ~= false and string.find(r[2], '"retired_at_ms"', 1, true) ~= nil
end
"""

# --- framework checkpoints (checkpoints/store.py); members are namespace\0checkpoint_id

# KEYS: doc, index, data, versions, blobs, runs.  ARGV: member, record, versions, run_id, restoring
# ('1': resumption putting archived state back), then blob field/value pairs.
# NOTFOUND / CLOSED like an append; RETIRED when the session's hot data went to the archive (the caller
# resumes it and retries: the common case costs no extra round trip). Every change bumps the document's
# ``ck_gen``, so retirement drops the state only if it is still what went to the archive.
CK_PUT = RETIRED_LIB + fill_statuses(
    r"""
if ARGV[5] ~= '1' and is_retired(KEYS[1]) then return redis.error_reply('RETIRED') end
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return redis.error_reply('NOTFOUND') end
if status == '$CLOSED' then return redis.error_reply('CLOSED') end
redis.call('ZADD', KEYS[2], 0, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[3])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[6], ARGV[1], ARGV[4]) end
if #ARGV > 5 then redis.call('HSET', KEYS[5], unpack(ARGV, 6)) end
redis.call('HINCRBY', KEYS[1], 'ck_gen', 1)
return 1
"""
)

# KEYS: doc, write_index, writes.  ARGV: restoring ('1' or '0'), then (member, payload, replace) triples.
# Returns how many it stored: a member already stored is kept unless `replace` is '1' (special writes:
# errors, interrupts).  RETIRED like CK_PUT.
CK_PUT_WRITES = (
    RETIRED_LIB
    + r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOTFOUND') end
if ARGV[1] ~= '1' and is_retired(KEYS[1]) then return redis.error_reply('RETIRED') end
local stored = 0
for i = 2, #ARGV, 3 do
  if ARGV[i + 2] == '1' or redis.call('HEXISTS', KEYS[3], ARGV[i]) == 0 then
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
    redis.call('ZADD', KEYS[2], 0, ARGV[i])
    stored = stored + 1
  end
end
if stored > 0 then redis.call('HINCRBY', KEYS[1], 'ck_gen', 1) end
return stored
"""
)

# Splits "a\0b\0c" into {"a", "b", "c"}; the blob field of channel c at version v in namespace ns is
# ns\0c\0v.  Shared by the reading and the dropping script.
_CK_LIB = r"""
local function split0(s)
  local parts, start = {}, 1
  while start <= #s do
    local e = string.find(s, '\0', start, true)
    if not e then parts[#parts + 1] = string.sub(s, start); break end
    parts[#parts + 1] = string.sub(s, start, e - 1)
    start = e + 1
  end
  return parts
end
local function ns_of(member)
  return string.sub(member, 1, string.find(member, '\0', 1, true))
end
"""

# KEYS: index, data, versions, blobs, write_index, writes, doc.  ARGV: lex min, lex max, count, reverse.
# Returns {{member, record, {channel, version, blob, ...}, {write payload, ...}}, ...}.
CK_READ = (
    RETIRED_LIB
    + _CK_LIB
    + r"""
if is_retired(KEYS[7]) then return redis.error_reply('RETIRED') end
local members
if ARGV[4] == '1' then
  members = redis.call('ZREVRANGEBYLEX', KEYS[1], ARGV[2], ARGV[1], 'LIMIT', 0, ARGV[3])
else
  members = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[1], ARGV[2], 'LIMIT', 0, ARGV[3])
end
local out = {}
for _, m in ipairs(members) do
  local rec = redis.call('HGET', KEYS[2], m)
  if rec then
    local ns = ns_of(m)
    local parts = split0(redis.call('HGET', KEYS[3], m) or '')
    local blobs = {}
    for i = 1, #parts - 1, 2 do
      local b = redis.call('HGET', KEYS[4], ns .. parts[i] .. '\0' .. parts[i + 1])
      if b then
        blobs[#blobs + 1] = parts[i]
        blobs[#blobs + 1] = parts[i + 1]
        blobs[#blobs + 1] = b
      end
    end
    local wm = redis.call('ZRANGEBYLEX', KEYS[5], '[' .. m .. '\0', '(' .. m .. '\0\255')
    local writes = {}
    for _, w in ipairs(wm) do
      local p = redis.call('HGET', KEYS[6], w)
      if p then writes[#writes + 1] = p end
    end
    out[#out + 1] = {m, rec, blobs, writes}
  end
end
return out
"""
)

# KEYS: index, data, versions, blobs, runs, write_index, writes, doc.  ARGV: mode ('latest': keep the newest
# checkpoint of each namespace; 'runs': drop those whose run id is in ARGV[2..]).  Drops the
# checkpoints, their writes, and every blob no remaining checkpoint reads.  Returns how many it dropped.
CK_DROP = (
    _CK_LIB
    + r"""
local members = redis.call('ZRANGE', KEYS[1], 0, -1)
local doomed = {}
if ARGV[1] == 'latest' then
  for i, m in ipairs(members) do
    local nxt = members[i + 1]
    if nxt and ns_of(nxt) == ns_of(m) then doomed[#doomed + 1] = m end
  end
else
  local wanted = {}
  for i = 2, #ARGV do wanted[ARGV[i]] = true end
  for _, m in ipairs(members) do
    local r = redis.call('HGET', KEYS[5], m)
    if r and wanted[r] then doomed[#doomed + 1] = m end
  end
end
if #doomed == 0 then return 0 end
for _, m in ipairs(doomed) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('HDEL', KEYS[2], m)
  redis.call('HDEL', KEYS[3], m)
  redis.call('HDEL', KEYS[5], m)
  for _, w in ipairs(redis.call('ZRANGEBYLEX', KEYS[6], '[' .. m .. '\0', '(' .. m .. '\0\255')) do
    redis.call('ZREM', KEYS[6], w)
    redis.call('HDEL', KEYS[7], w)
  end
end
local keep = {}
for _, m in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local ns = ns_of(m)
  local parts = split0(redis.call('HGET', KEYS[3], m) or '')
  for i = 1, #parts - 1, 2 do keep[ns .. parts[i] .. '\0' .. parts[i + 1]] = true end
end
for _, f in ipairs(redis.call('HKEYS', KEYS[4])) do
  if not keep[f] then redis.call('HDEL', KEYS[4], f) end
end
if redis.call('EXISTS', KEYS[8]) == 1 then redis.call('HINCRBY', KEYS[8], 'ck_gen', 1) end
return #doomed
"""
)

# KEYS: doc, then every checkpoint key.  ARGV: expected ck_gen ('' = any).  Deletes the session's
# framework state (DeleteCheckpoints; retirement once archived, only if unchanged since the snapshot).
# Returns how many checkpoints it deleted, -1 when the state changed since the snapshot.
CK_CLEAR = r"""
if ARGV[1] ~= '' and (redis.call('HGET', KEYS[1], 'ck_gen') or '0') ~= ARGV[1] then return -1 end
local n = redis.call('ZCARD', KEYS[2])
redis.call('DEL', unpack(KEYS, 2))
if n > 0 and redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HINCRBY', KEYS[1], 'ck_gen', 1) end
return n
"""
