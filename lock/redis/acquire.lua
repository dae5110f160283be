-- acquire.lua: take the lock if it is free and nobody live is queued ahead
-- of us, or join the wait queue (or renew our place in it).
--
-- KEYS[1] L, the lock: "owner:expires_ms:waiters:fence:granted_us:grant_ms"
--         while held, "-:0:waiters:fence:0:0" once released; waiters is 1
--         when the queue may be non-empty (it is never 0 while it is not), so
--         an uncontended acquire or release never looks at the queue. The
--         lease is kept in the value (expires_ms, server time) and the key
--         itself lives 7 days, so the last fence survives releases and
--         expiries. Keys derived from L share its hash tag, so its Cluster slot:
--   L:q  zset  queued entries by arrival (server µs)
--   L:l  zset  queued entries by lease expiry (server ms)
-- ARGV[1] token   ARGV[2] ttl_ms   ARGV[3] waiter lease ms ("0": try once, never queue)
-- ARGV[4] entry "token:grant_ms:channel" (the lease to grant on hand-off, and
--         the Pub/Sub channel suffix that reaches this waiter's process)
--
-- Returns {1, fence, now_us}             taken now, for ttl_ms
--         {2, grant}                     handed to us already: "fence:granted_us:grant_ms"
--         {0, left_ms, now_us}           not taken (try once)
--         {3, left_ms, now_us, is_head}  queued; left_ms is the holder's lease left,
--                                        reported to the queue head only (-1 otherwise)
-- Time comes from the server only.
local L, token = KEYS[1], ARGV[1]
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)

local owner, expires, last, waiters, rest = nil, 0, 0, '0', nil
local v = redis.call('GET', L)
if v then
  local o, e, w, f, r = string.match(v, '^([^:]+):(%d+):(%d):(%d+):(.*)$')
  last, waiters, rest = tonumber(f), w, r
  if o ~= '-' and tonumber(e) > now_ms then
    if o == token then
      return {2, f .. ':' .. r}
    end
    owner, expires = o, tonumber(e)
  end
end

local q, l = L .. ':q', L .. ':l'
local entry = ARGV[4]
if not owner then
  local head = nil
  if waiters == '1' then
    -- Evict waiters at the head whose place expired: they died while queued.
    head = redis.call('ZRANGE', q, 0, 0)[1]
    while head and tonumber(redis.call('ZSCORE', l, head) or '0') <= now_ms do
      redis.call('ZREM', q, head)
      redis.call('ZREM', l, head)
      head = redis.call('ZRANGE', q, 0, 0)[1]
    end
  end
  if not head or head == entry then
    local more = '0'
    if head then
      redis.call('ZREM', q, entry)
      redis.call('ZREM', l, entry)
      if redis.call('EXISTS', q) == 1 then more = '1' end
    end
    local fence = last + 1
    if fence < now_us then fence = now_us end
    local ttl = tonumber(ARGV[2])
    redis.call('SET', L, string.format('%s:%d:%s:%d:%d:%d', token, now_ms + ttl, more, fence, now_us, ttl), 'PX', 604800000)
    return {1, fence, now_us}
  end
end

if ARGV[3] == '0' then
  return {0, expires - now_ms, now_us}
end

if waiters ~= '1' then
  -- Mark the lock as having waiters, so its release looks at the queue.
  if v then
    redis.call('SET', L, string.gsub(v, '^([^:]+:%d+:)0', '%11', 1), 'PX', 604800000)
  else
    redis.call('SET', L, '-:0:1:0:0:0', 'PX', 604800000)
  end
end
local lease = tonumber(ARGV[3])
local qttl = redis.call('PTTL', q)
local is_head = 0
if redis.call('ZADD', l, now_ms + lease, entry) == 1 then
  redis.call('ZADD', q, now_us, entry) -- new: join at the tail
  if qttl == -2 then is_head = 1 end
elseif redis.call('ZRANK', q, entry) == 0 then
  is_head = 1
end
-- The queue outlives its last live waiter by a little, then vanishes. Only
-- ever lengthen it: other waiters may have longer leases than ours.
if qttl < 2 * lease then
  redis.call('PEXPIRE', q, 2 * lease)
  redis.call('PEXPIRE', l, 2 * lease)
end
local left = -1
if is_head == 1 and owner then left = expires - now_ms end
return {3, left, now_us, is_head}
