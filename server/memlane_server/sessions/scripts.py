"""Lua scripts: each runs atomically inside Redis and touches only one session's keys (one hash slot)."""

from __future__ import annotations

# KEYS: doc.  ARGV: field/value pairs.  Creates the document unless it exists; 1 if it created it.
CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""

# Status codes as stored in the document (memlane.v1.SessionStatus values).
# KEYS: doc, msgs, order, alive.  ARGV: now_ms, ttl_ms, count, then (id, fingerprint, payload, tokens) each.
# Returns {token_total, message_count, seq_1, dup_1, seq_2, dup_2, ...}.
# A batch lands whole or not at all: every id is checked before anything is written.
APPEND = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return redis.error_reply('NOTFOUND') end
if status == '3' then return redis.error_reply('CLOSED') end
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
  if status ~= '1' then redis.call('HSET', KEYS[1], 'status', '1') end
  local ttl = tonumber(ARGV[2])
  if ttl > 0 then redis.call('SET', KEYS[4], '1', 'PX', ttl) end
end
out[1] = redis.call('HINCRBY', KEYS[1], 'token_total', tokens)
out[2] = redis.call('HINCRBY', KEYS[1], 'message_count', added)
return out
"""

# KEYS: doc, order, msgs.  ARGV: min, max (ZRANGEBYSCORE bounds on seq), count, reverse (0/1).
# Returns {seq_1, id_1, payload_1, ...}; NOTFOUND when the session does not exist.
READ_RANGE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOTFOUND') end
local ids
if ARGV[4] == '1' then
  ids = redis.call('ZREVRANGEBYSCORE', KEYS[2], ARGV[2], ARGV[1], 'WITHSCORES', 'LIMIT', 0, ARGV[3])
else
  ids = redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[1], ARGV[2], 'WITHSCORES', 'LIMIT', 0, ARGV[3])
end
local out = {}
for i = 1, #ids, 2 do
  out[#out + 1] = ids[i + 1]
  out[#out + 1] = ids[i]
  out[#out + 1] = redis.call('HGET', KEYS[3], ids[i]) or ''
end
return out
"""

# KEYS: doc, alive.  ARGV: to_status, timestamp field ('' for none), now_ms, allowed from-statuses (csv).
# Returns the previous status; NOTFOUND / ILLEGAL <from> / ALIVE (expiring a revived session) on failure.
# Reaching CLOSED or EXPIRED drops the activity key so no expiry event fires for an ended session.
TRANSITION = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return redis.error_reply('NOTFOUND') end
if status == ARGV[1] then return status end
-- Expiry only wins if the activity key is still gone: an append between the expiry event and this
-- script revived the session.
if ARGV[1] == '4' and redis.call('EXISTS', KEYS[2]) == 1 then return redis.error_reply('ALIVE') end
local allowed = false
for s in string.gmatch(ARGV[4], '[^,]+') do
  if s == status then allowed = true end
end
if not allowed then return redis.error_reply('ILLEGAL ' .. status) end
redis.call('HSET', KEYS[1], 'status', ARGV[1])
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], ARGV[2], ARGV[3]) end
if ARGV[1] == '3' or ARGV[1] == '4' then redis.call('DEL', KEYS[2]) end
return status
"""

# KEYS: doc.  ARGV: expected through_seq, then field/value pairs of the new summary.
# Compare-and-set so a summary computed from an old view never overwrites a newer one.
SET_SUMMARY = """
local cur = redis.call('HGET', KEYS[1], 'summary_through_seq')
if cur == false and redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOTFOUND') end
if (tonumber(cur) or 0) ~= tonumber(ARGV[1]) then return redis.error_reply('STALE ' .. (cur or '0')) end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
return 1
"""

# KEYS: doc.  ARGV: new state, allowed current states (csv; '' = any).
SET_PROMOTION = """
local cur = redis.call('HGET', KEYS[1], 'promotion_state')
if not cur then return redis.error_reply('NOTFOUND') end
if ARGV[2] ~= '' then
  local ok = false
  for s in string.gmatch(ARGV[2], '[^,]+') do if s == cur then ok = true end end
  if not ok then return redis.error_reply('ILLEGAL ' .. cur) end
end
redis.call('HSET', KEYS[1], 'promotion_state', ARGV[1])
return cur
"""
