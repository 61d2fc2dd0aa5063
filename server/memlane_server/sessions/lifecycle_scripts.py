"""Lua scripts of two lifecycle moves outside the end pipeline, each on one session's slot: an expired
session taken up again by an append, and an inactivity timeout changed by UpdateSession."""

from __future__ import annotations

from .scripts import EVENT_LIB, fill_statuses

# KEYS: doc, alive, outbox.  ARGV: now_ms, then the RESUMED event (base 2).
# EXPIRED -> ACTIVE with a fresh promotion state (the next end runs the pipeline for the new turns), the
# inactivity clock running again from now, and the event, in one step. Returns the previous status: only
# EXPIRED means this call moved it (another caller may have revived or closed it first).
RESUME_EXPIRED = EVENT_LIB + fill_statuses(
    r"""
local st = redis.call('HMGET', KEYS[1], 'status', 'ttl_seconds')
if not st[1] then return redis.error_reply('NOTFOUND') end
if st[1] ~= '$EXPIRED' then return tonumber(st[1]) end
if event_fenced(2) then return redis.error_reply('FENCE') end
redis.call('HSET', KEYS[1], 'status', '$ACTIVE', 'promotion_state', '$P_NONE', 'last_activity_at_ms', ARGV[1])
local ttl = tonumber(st[2] or '0') * 1000
if ttl > 0 then redis.call('SET', KEYS[2], '1', 'PX', ttl) end
event_push(KEYS[3], KEYS[1], 2)
return tonumber(st[1])
"""
)

# KEYS: doc, alive.  ARGV: now_ms.
# Re-arms a live session's inactivity clock after its timeout changed: it now runs out at the last activity
# plus the document's ttl_seconds (at once if that is past: 1 ms, so Redis expires the key and sends the
# expiry event), and a timeout of 0 stops it. Returns the new deadline (ms), -1 for no timeout, -2 for a
# session that has ended (no clock to move).
RETIME = fill_statuses(
    r"""
local st = redis.call('HMGET', KEYS[1], 'status', 'ttl_seconds', 'last_activity_at_ms')
if not st[1] then return redis.error_reply('NOTFOUND') end
if st[1] ~= '$ACTIVE' and st[1] ~= '$IDLE' then return -2 end
local ttl = tonumber(st[2] or '0') * 1000
if ttl <= 0 then
  redis.call('PERSIST', KEYS[2])
  return -1
end
local now = tonumber(ARGV[1])
local left = tonumber(st[3] or ARGV[1]) + ttl - now
if left < 1 then left = 1 end
redis.call('SET', KEYS[2], '1', 'PX', left)
return now + left
"""
)
