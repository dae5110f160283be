-- release.lua: if the caller owns the lock, pass it on and wake only the new
-- owner, or free it. A waiter that gives up calls this too, with its entry,
-- to leave the queue (and pass on a lock handed to it in the meantime).
--
-- KEYS[1] L, the lock (see acquire.lua for its two forms, L:f, L:q and L:l)
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
if ARGV[2] ~= '' then
  redis.call('ZREM', L .. ':q', ARGV[2])
  redis.call('ZREM', L .. ':l', ARGV[2])
end
local v = redis.call('GET', L)
if v == token then
  -- Ours, in the short form: nobody is queued.
  if ARGV[4] ~= '' then
    local now_us = time_us()
    local fence = next_fence(L, now_us)
    redis.call('SET', L, ARGV[4], 'PX', ARGV[5])
    return {3, fence, now_us}
  end
  redis.call('DEL', L)
  return {1}
end
if not v or not string.find(v, ':', 1, true) then
  return {0}
end
local q, l = L .. ':q', L .. ':l'
local o, e = string.match(v, '^([^:]+):(%d+):')
local now_us = time_us()
local now_ms = math.floor(now_us / 1000)
if o ~= token or tonumber(e) <= now_ms then
  return {0}
end

-- The first live queued waiter (evicting dead ones), and whether another follows.
local head = redis.call('ZRANGE', q, 0, 1, 'WITHSCORES')
while head[1] and tonumber(redis.call('ZSCORE', l, head[1]) or '0') <= now_ms do
  redis.call('ZREM', q, head[1])
  redis.call('ZREM', l, head[1])
  head = redis.call('ZRANGE', q, 0, 1, 'WITHSCORES')
end

if ARGV[4] ~= '' and (not head[1] or now_us - tonumber(head[2]) < tonumber(ARGV[6])) then
  local ttl = tonumber(ARGV[5])
  local fence = next_fence(L, now_us)
  if head[1] then
    redis.call('SET', L, string.format('%s:%d:%d:%d:%d', ARGV[4], now_ms + ttl, fence, now_us, ttl), 'PX', '604800000')
  else
    redis.call('SET', L, ARGV[4], 'PX', ttl)
  end
  return {3, fence, now_us}
end

if head[1] then
  redis.call('ZREM', q, head[1])
  redis.call('ZREM', l, head[1])
  local next_token, grant_ms, channel = string.match(head[1], '^([^:]+):(%d+):(.*)$')
  local fence = next_fence(L, now_us)
  if head[3] then
    redis.call('SET', L, string.format('%s:%d:%d:%d:%s', next_token, now_ms + tonumber(grant_ms), fence, now_us, grant_ms), 'PX', '604800000')
  else
    -- The last waiter: back to the short form. Should its wake-up be lost,
    -- acquire.lua still recognises its own token there.
    redis.call('SET', L, next_token, 'PX', grant_ms)
  end
  redis.call('PUBLISH', ARGV[3] .. channel, next_token .. ' ' .. string.format('%d:%d:%s', fence, now_us, grant_ms))
  return {2}
end
redis.call('DEL', L)
return {1}
