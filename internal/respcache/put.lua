-- put.lua: store one cache entry and keep its tenant within a byte bound,
-- dropping the tenant's entries closest to their expiry first (with one
-- TTL per tenant, the oldest). Every key shares the tenant's hash tag.
--
-- KEYS[1] the entry's key (ARGV[6] .. ARGV[3])
-- KEYS[2] the tenant's index: zset, cache key -> expiry (µs, server time)
-- KEYS[3] the tenant's sizes: hash, "k" .. cache key -> bytes, "n" -> total
-- ARGV[1] the encoded entry   ARGV[2] its TTL in ms   ARGV[3] its cache key
-- ARGV[4] its size in bytes   ARGV[5] the tenant's bound in bytes
-- ARGV[6] what starts the key of each of the tenant's entries
--
-- Returns the number of entries dropped to make room.
local idx, sizes, member = KEYS[2], KEYS[3], ARGV[3]
local size, bound = tonumber(ARGV[4]), tonumber(ARGV[5])
-- In µs, so that entries stored one after the other never tie (a tie
-- would be broken by the key's letters, not by age). Exact in a double;
-- passed to Redis through '%.0f', as Lua would write it '%.14g'.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

local total = tonumber(redis.call('HGET', sizes, 'n')) or 0
-- forget removes m from the index and returns what it counted for.
local function forget(m)
  local n = tonumber(redis.call('HGET', sizes, 'k' .. m)) or 0
  redis.call('ZREM', idx, m)
  redis.call('HDEL', sizes, 'k' .. m)
  return n
end

-- The entry this one replaces (SET below overwrites its value).
total = total - forget(member)
-- Entries past their expiry, whose values Redis has dropped: a few per
-- call, so that the index does not keep the dead ones.
for _, m in ipairs(redis.call('ZRANGEBYSCORE', idx, '-inf', string.format('%.0f', now), 'LIMIT', 0, 16)) do
  total = total - forget(m)
  redis.call('DEL', ARGV[6] .. m)
end
-- Room for the new one. An empty index with a total left means Redis
-- evicted the index (allkeys-* policies): count afresh.
local dropped = 0
while total + size > bound do
  local first = redis.call('ZRANGE', idx, 0, 0)
  if #first == 0 then
    total = 0
    break
  end
  total = total - forget(first[1])
  redis.call('DEL', ARGV[6] .. first[1])
  dropped = dropped + 1
end
if total < 0 then
  total = 0
end

redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', idx, string.format('%.0f', now + tonumber(ARGV[2]) * 1000), member)
redis.call('HSET', sizes, 'k' .. member, size, 'n', total + size)
-- The index lives as long as the tenant's longest-lived entry.
local last = redis.call('ZRANGE', idx, -1, -1, 'WITHSCORES')
local until_ms = string.format('%.0f', math.ceil(tonumber(last[2]) / 1000))
redis.call('PEXPIREAT', idx, until_ms)
redis.call('PEXPIREAT', sizes, until_ms)
return dropped
