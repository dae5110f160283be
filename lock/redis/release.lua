-- release.lua: if the caller owns the lock, hand it to the first live waiter
-- (and wake only that waiter) or free it. Also takes the caller out of the
-- queue, so a waiter that gives up calls this too.
--
-- KEYS[1] lock    KEYS[2] meta    KEYS[3] queue    KEYS[4] leases (see acquire.lua)
-- KEYS[5] the caller's notify list
-- ARGV[1] token   ARGV[2] the caller's queue entry ("" for a plain release)
-- ARGV[3] meta_ttl_ms
--
-- The next waiter's notify list is KEYS[1] .. ':n:' .. its token: the same
-- hash tag, so the same Cluster slot.
--
-- Returns 0 not the owner (nothing else changed but our own queue entry),
--         1 released (nobody waiting), 2 handed off.
if ARGV[2] ~= '' then
  -- A waiter giving up: leave the queue and drop any wake-up sent to us.
  redis.call('ZREM', KEYS[3], ARGV[2])
  redis.call('ZREM', KEYS[4], ARGV[2])
  redis.call('DEL', KEYS[5])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('DEL', KEYS[1])
  return 1
end

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now_us / 1000)
while true do
  local h = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  if not h then break end
  local alive = tonumber(redis.call('ZSCORE', KEYS[4], h) or '0') > now_ms
  redis.call('ZREM', KEYS[3], h)
  redis.call('ZREM', KEYS[4], h)
  if alive then
    local sep = string.find(h, ':', 1, true)
    local next_token, grant_ms = string.sub(h, 1, sep - 1), string.sub(h, sep + 1)
    local fence = tonumber(redis.call('HGET', KEYS[2], 'f') or '0') + 1
    if fence < now_us then fence = now_us end
    local grant = string.format('%d', fence) .. ':' .. string.format('%d', now_us) .. ':' .. grant_ms
    redis.call('SET', KEYS[1], next_token, 'PX', grant_ms)
    redis.call('HSET', KEYS[2], 'f', string.format('%d', fence), 'g', grant)
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
    local notify = KEYS[1] .. ':n:' .. next_token
    redis.call('RPUSH', notify, grant)
    redis.call('PEXPIRE', notify, grant_ms)
    return 2
  end
end
redis.call('DEL', KEYS[1])
return 1
