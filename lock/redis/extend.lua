-- extend.lua: reset the caller's lease if it still owns the lock.
--
-- KEYS[1] lock
-- ARGV[1] token   ARGV[2] ttl_ms
--
-- Returns 1 extended, 0 not the owner (nothing changed).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
