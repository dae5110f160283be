-- append.lua: add one frame to the running generation, if it is the caller's.
--
-- KEYS[1] M, the flight record (see claim.lua)   KEYS[2] S = M .. ':' .. gen
-- ARGV[1] gen   ARGV[2] the frame (bytes)   ARGV[3] keep ms
--
-- Returns 1 appended, 0 gen is not the running generation (nothing changed).
local cur = redis.call('HMGET', KEYS[1], 'g', 's')
if cur[1] ~= ARGV[1] or cur[2] ~= 'r' then
  return 0
end
redis.call('XADD', KEYS[2], '*', 'd', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
