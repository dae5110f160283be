-- extend.lua: reset the lease to ttl from now if the caller owns the lock
-- here.
--
-- KEYS[1] the lock   ARGV[1] "token:"   ARGV[2] ttl_ms
--
-- Returns 1 extended, 0 not the owner here.
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
