-- acquire.lua: take the lock if it is free and nobody is queued ahead of us,
-- or join the wait queue (or renew our place in it).
--
-- KEYS[1] lock         string: owner token, PX = lease
-- KEYS[2] meta         hash: f = last fence issued, s = queue sequence,
--                      g = grant of the last hand-off ("fence:granted_us:grant_ms")
-- KEYS[3] queue        zset: member = entry ("token:grant_ms"), score = arrival sequence
-- KEYS[4] leases       zset: member = entry, score = server ms when the waiter's place expires
-- KEYS[5] notify       list: the caller's wake-up list (a hand-off pushes its grant here)
-- ARGV[1] token        the caller's owner token
-- ARGV[2] ttl_ms       lease to set when the lock is taken now
-- ARGV[3] entry        the caller's queue entry
-- ARGV[4] lease_ms     waiter lease; "0" = try once, never queue
-- ARGV[5] meta_ttl_ms  how long meta outlives the last acquisition
--
-- Returns {1, fence, now_us}            taken now, for ttl_ms
--         {2, grant, now_us}            already handed to us (grant as in meta.g)
--         {0, pttl_ms, now_us}          held or queued ahead; not queued (try once)
--         {3, pttl_ms, now_us, is_head} queued: wait on KEYS[5]; pttl_ms is the holder's
--                                       remaining lease (-2 when free)
-- Time comes from the server only.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
local token, entry = ARGV[1], ARGV[3]

local owner = redis.call('GET', KEYS[1])
if owner == token then
  -- Handed to us while we were between waits: the grant is in meta.
  redis.call('DEL', KEYS[5])
  return {2, redis.call('HGET', KEYS[2], 'g'), now_us}
end

-- Evict waiters at the head whose place expired: they died while queued.
local head = false
while true do
  local h = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not h then break end
  if tonumber(redis.call('ZSCORE', KEYS[4], h) or '0') > now_ms then
    head = h
    break
  end
  redis.call('ZREM', KEYS[3], h)
  redis.call('ZREM', KEYS[4], h)
end

if not owner and (not head or head == entry) then
  local fence = tonumber(redis.call('HGET', KEYS[2], 'f') or '0') + 1
  if fence < now_us then fence = now_us end
  local f = string.format('%d', fence)
  redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
  -- meta.g is only read after a hand-off, which writes it; skip it here.
  redis.call('HSET', KEYS[2], 'f', f)
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
  if head then
    redis.call('ZREM', KEYS[3], entry)
    redis.call('ZREM', KEYS[4], entry)
  end
  return {1, fence, now_us}
end

local pttl = redis.call('PTTL', KEYS[1])
if ARGV[4] == '0' then
  return {0, pttl, now_us}
end

if not redis.call('ZSCORE', KEYS[3], entry) then
  local seq = redis.call('HINCRBY', KEYS[2], 's', 1)
  redis.call('ZADD', KEYS[3], seq, entry)
  redis.call('PEXPIRE', KEYS[2], ARGV[5])
  if not head then head = entry end
end
local lease = tonumber(ARGV[4])
redis.call('ZADD', KEYS[4], now_ms + lease, entry)
-- The queue outlives its last live waiter by a little, then vanishes. Only
-- ever lengthen it: other waiters may have longer leases than ours.
if redis.call('PTTL', KEYS[3]) < 2 * lease then
  redis.call('PEXPIRE', KEYS[3], 2 * lease)
end
if redis.call('PTTL', KEYS[4]) < 2 * lease then
  redis.call('PEXPIRE', KEYS[4], 2 * lease)
end
local is_head = 0
if head == entry then is_head = 1 end
return {3, pttl, now_us, is_head}
