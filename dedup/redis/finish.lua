-- finish.lua: complete the running generation, if it is the caller's, and
-- retain its record and frames.
--
-- KEYS[1] M, the flight record (see claim.lua)   KEYS[2] S = M .. ':' .. gen
-- ARGV[1] gen   ARGV[2] retain ms
--
-- Returns 1 finished, 0 gen is not the running generation (nothing changed).
local cur = redis.call('HMGET', KEYS[1], 'g', 's')
if cur[1] ~= ARGV[1] or cur[2] ~= 'r' then
  return 0
end
redis.call('XADD', KEYS[2], '*', 'e', '')
redis.call('HSET', KEYS[1], 's', 'f')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
