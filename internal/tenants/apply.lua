-- apply.lua: one change of the tenant registry, atomically.
--
-- KEYS[1] hash: tenant name -> record (JSON)
-- KEYS[2] hash: key hash -> tenant name
-- KEYS[3] string: the registry's version
-- ARGV[1] name    the tenant
-- ARGV[2] old     the record the change was made from; '' = must not exist
-- ARGV[3] new     the new record; '' = delete
-- ARGV[4] n       how many key hashes follow to add
-- ARGV[5..4+n]    key hashes to add; the rest are key hashes to drop
--
-- Returns {version} once applied, {-1} when the record is not old, {-2}
-- when a key to add is another tenant's.
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (cur or '') ~= ARGV[2] then
  return {-1}
end
local n = tonumber(ARGV[4])
for i = 5, 4 + n do
  local owner = redis.call('HGET', KEYS[2], ARGV[i])
  if owner and owner ~= ARGV[1] then
    return {-2}
  end
end
for i = 5 + n, #ARGV do
  redis.call('HDEL', KEYS[2], ARGV[i])
end
for i = 5, 4 + n do
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[1])
end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
return {redis.call('INCR', KEYS[3])}
