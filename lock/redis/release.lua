-- release.lua: if the caller owns the lock, hand it to the first live waiter
-- and wake only that waiter, or free it. A waiter that gives up calls this
-- too, with its entry, to leave the queue (and pass on a lock handed to it
-- in the meantime).
--
-- KEYS[1] L, the lock (see acquire.lua for its value, L:q and L:l)
-- ARGV[1] token   ARGV[2] the caller's queue entry, or "" for a plain release
-- ARGV[3] Pub/Sub channel prefix: the next waiter is woken on
--         ARGV[3] .. <its entry's channel suffix> with "token grant"
--
-- Returns 0 not the owner (nothing else changed but our own queue entry),
--         1 released (nobody waiting), 2 handed off.
local L, token = KEYS[1], ARGV[1]
local q, l = L .. ':q', L .. ':l'
if ARGV[2] ~= '' then
  redis.call('ZREM', q, ARGV[2])
  redis.call('ZREM', l, ARGV[2])
end
local v = redis.call('GET', L)
if not v then
  return 0
end
local o, e, f = string.match(v, '^([^:]+):(%d+):(%d+):')
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
if o ~= token or tonumber(e) <= now_ms then
  return 0
end

local head = redis.call('ZRANGE', q, 0, 0)[1]
while head do
  local alive = tonumber(redis.call('ZSCORE', l, head) or '0') > now_ms
  redis.call('ZREM', q, head)
  redis.call('ZREM', l, head)
  if alive then
    local next_token, grant_ms, channel = string.match(head, '^([^:]+):(%d+):(.*)$')
    local fence = tonumber(f) + 1
    if fence < now_us then fence = now_us end
    local grant = string.format('%d:%d:%s', fence, now_us, grant_ms)
    redis.call('SET', L, string.format('%s:%d:%s', next_token, now_ms + tonumber(grant_ms), grant), 'PX', 604800000)
    redis.call('PUBLISH', ARGV[3] .. channel, next_token .. ' ' .. grant)
    return 2
  end
  head = redis.call('ZRANGE', q, 0, 0)[1]
end
-- Keep the last fence: the next holder's must be larger.
redis.call('SET', L, '-:0:' .. f .. ':0:0', 'PX', 604800000)
return 1
