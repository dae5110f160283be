-- release.lua: if the caller owns the lock, pass it on and wake only the new
-- owner, or free it. A waiter that gives up calls this too, with its entry,
-- to leave the queue (and pass on a lock handed to it in the meantime).
--
-- KEYS[1] L, the lock (see acquire.lua for its value, L:q and L:l)
-- ARGV[1] token   ARGV[2] the caller's queue entry, or "" for a plain release
-- ARGV[3] Pub/Sub channel prefix: a queued waiter is woken on
--         ARGV[3] .. <its entry's channel suffix> with "token grant"
-- ARGV[4] token of a waiter in the caller's own process to pass the lock to
--         directly, or "" (not fair mode: see ARGV[6])
-- ARGV[5] that waiter's ttl_ms
-- ARGV[6] µs the first queued waiter may have waited before a direct pass is
--         refused in its favour (bounds how long a busy process keeps the lock)
--
-- Returns {0}                    not the owner (nothing else changed but our own queue entry)
--         {1}                    released (nobody waiting)
--         {2}                    handed to the first queued waiter
--         {3, fence, now_us}     passed to ARGV[4]
local L, token = KEYS[1], ARGV[1]
local q, l = L .. ':q', L .. ':l'
if ARGV[2] ~= '' then
  redis.call('ZREM', q, ARGV[2])
  redis.call('ZREM', l, ARGV[2])
end
local v = redis.call('GET', L)
if not v then
  return {0}
end
local o, e, w, f = string.match(v, '^([^:]+):(%d+):(%d):(%d+):')
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
if o ~= token or tonumber(e) <= now_ms then
  return {0}
end
local fence = tonumber(f) + 1
if fence < now_us then fence = now_us end

-- The first live queued waiter (evicting dead ones), and whether another follows.
local head = {}
if w == '1' then
  head = redis.call('ZRANGE', q, 0, 1, 'WITHSCORES')
  while head[1] and tonumber(redis.call('ZSCORE', l, head[1]) or '0') <= now_ms do
    redis.call('ZREM', q, head[1])
    redis.call('ZREM', l, head[1])
    head = redis.call('ZRANGE', q, 0, 1, 'WITHSCORES')
  end
end

if ARGV[4] ~= '' and (not head[1] or now_us - tonumber(head[2]) < tonumber(ARGV[6])) then
  local ttl = tonumber(ARGV[5])
  local queued = '0'
  if head[1] then queued = '1' end
  redis.call('SET', L, string.format('%s:%d:%s:%d:%d:%d', ARGV[4], now_ms + ttl, queued, fence, now_us, ttl), 'PX', 604800000)
  return {3, fence, now_us}
end

if head[1] then
  redis.call('ZREM', q, head[1])
  redis.call('ZREM', l, head[1])
  local more = '0'
  if head[3] then more = '1' end
  local next_token, grant_ms, channel = string.match(head[1], '^([^:]+):(%d+):(.*)$')
  local grant = string.format('%d:%d:%s', fence, now_us, grant_ms)
  redis.call('SET', L, string.format('%s:%d:%s:%s', next_token, now_ms + tonumber(grant_ms), more, grant), 'PX', 604800000)
  redis.call('PUBLISH', ARGV[3] .. channel, next_token .. ' ' .. grant)
  return {2}
end
-- Keep the last fence: the next holder's must be larger.
redis.call('SET', L, '-:0:0:' .. f .. ':0:0', 'PX', 604800000)
return {1}
