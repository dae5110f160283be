-- acquire.lua: take the lock if it is free and nobody live is queued ahead
-- of us, or join the wait queue (or renew our place in it).
--
-- KEYS[1] L, the lock, in one of two forms:
--         "owner"        held, nobody queued: the lease is the key's own TTL
--                        (the uncontended form: one SET NX takes it, and a
--                        release deletes it);
--         "owner:expires_ms:fence:granted_us:grant_ms"
--                        waiters may be queued: the lease is expires_ms
--                        (server time), the key lives 7 days, and the
--                        grant fields tell a waiter what it was handed if
--                        its wake-up was lost; owner "-" when released.
--         Keys derived from L share its hash tag, so its Cluster slot:
--   L:f  the last fence (fence.lua)
--   L:q  zset  queued entries by arrival (server µs)
--   L:l  zset  queued entries by lease expiry (server ms)
-- ARGV[1] token   ARGV[2] ttl_ms   ARGV[3] waiter lease ms ("0": try once, never queue)
-- ARGV[4] entry "token:grant_ms:channel" (the lease to grant on hand-off, and
--         the Pub/Sub channel suffix that reaches this waiter's process)
-- ARGV[5] "1" if the caller may have an entry queued already, else ""
--
-- Returns {1, fence, now_us}             taken now, for ttl_ms
--         {2, grant, now_us}             ours already (handed to us, or taken by an
--                                        attempt whose reply was lost):
--                                        "fence:granted_us:grant_ms"
--         {0, left_ms, now_us}           not taken (try once)
--         {3, left_ms, now_us, is_head}  queued; left_ms is the holder's lease left,
--                                        reported to the queue head only (-1 otherwise)
-- Time comes from the server only.
local L, token = KEYS[1], ARGV[1]
-- With GET, a failed SET NX returns the value it found: one call fewer on
-- every contended attempt (Redis and Valkey 7+).
local v = redis.call('SET', L, token, 'NX', 'PX', ARGV[2], 'GET')
if not v then
  -- Free, so nobody is queued (waiters keep L in the long form).
  if ARGV[5] == '1' then
    -- Unless L vanished under them (an eviction, an outside DEL): leave.
    redis.call('ZREM', L .. ':q', ARGV[4])
    redis.call('ZREM', L .. ':l', ARGV[4])
  end
  local now_us = time_us()
  return {1, next_fence(L, now_us), now_us}
end

local ttl = tonumber(ARGV[2])
local q, l = L .. ':q', L .. ':l'
local entry = ARGV[4]

local now_us = time_us()
local now_ms = math.floor(now_us / 1000)
if not string.find(v, ':', 1, true) then
  local left = redis.call('PTTL', L)
  if ARGV[3] == '0' and v ~= token then
    return {0, left, now_us}
  end
  -- The holder's grant, as a hand-off would have set it: its fence is the
  -- last one minted, and its lease ends in left ms.
  local grant = string.format('%s:%d:%d', redis.call('GET', L .. ':f') or '0', now_us, left)
  if v == token then
    return {2, grant, now_us}
  end
  -- Someone will wait: move the lease into the value, in the long form.
  v = string.format('%s:%d:%s', v, now_ms + left, grant)
  redis.call('SET', L, v, 'PX', '604800000')
end

local owner, expires = nil, 0
local o, e, f, grant = string.match(v, '^([^:]+):(%d+):(%d+):(.*)$')
if o ~= '-' and tonumber(e) > now_ms then
  if o == token then
    return {2, f .. ':' .. grant, now_us}
  end
  owner, expires = o, tonumber(e)
end

if not owner then
  -- Evict waiters at the head whose place expired: they died while queued.
  local head = redis.call('ZRANGE', q, 0, 0)[1]
  while head and tonumber(redis.call('ZSCORE', l, head) or '0') <= now_ms do
    redis.call('ZREM', q, head)
    redis.call('ZREM', l, head)
    head = redis.call('ZRANGE', q, 0, 0)[1]
  end
  if not head or head == entry then
    if head then
      redis.call('ZREM', q, entry)
      redis.call('ZREM', l, entry)
    end
    local fence = next_fence(L, now_us)
    if redis.call('EXISTS', q) == 1 then
      redis.call('SET', L, string.format('%s:%d:%d:%d:%d', token, now_ms + ttl, fence, now_us, ttl), 'PX', '604800000')
    else
      redis.call('SET', L, token, 'PX', ttl) -- nobody else waits: the short form
    end
    return {1, fence, now_us}
  end
end

if ARGV[3] == '0' then
  return {0, expires - now_ms, now_us}
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
-- ever lengthen it: other waiters may have longer leases than ours. It is
-- lengthened to 2 leases once it has less than 1.5 left (it needs 1: our
-- entry's): a lengthening every half lease, not on nearly every call.
if qttl < 1.5 * lease then
  redis.call('PEXPIRE', q, 2 * lease)
  redis.call('PEXPIRE', l, 2 * lease)
end
local left = -1
if is_head == 1 and owner then left = expires - now_ms end
return {3, left, now_us, is_head}
