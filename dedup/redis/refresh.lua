-- refresh.lua: keep the running generation's keys alive, if it is the caller's.
--
-- KEYS[1] M, the flight record (see claim.lua)   KEYS[2] S = M .. ':' .. gen
-- ARGV[1] gen   ARGV[2] keep ms
--
-- Returns 1 refreshed, 0 gen is not the running generation.
local cur = redis.call('HMGET', KEYS[1], 'g', 's')
if cur[1] ~= ARGV[1] or cur[2] ~= 'r' then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2]) -- 0 before the first frame: fine
return 1
