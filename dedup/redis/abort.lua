-- abort.lua: end the running generation without a result, if it is still
-- generation ARGV[1]. Its frames are dropped and a lone abort entry tells
-- its readers (blocked ones wake at once); the record goes, so the next
-- joiner may claim the key.
--
-- KEYS[1] M, the flight record (see claim.lua)   KEYS[2] S = M .. ':' .. gen
-- ARGV[1] gen   ARGV[2] linger ms (life of the abort entry)
--
-- Returns 1 aborted, 0 gen is not the running generation (nothing changed).
local cur = redis.call('HMGET', KEYS[1], 'g', 's')
if cur[1] ~= ARGV[1] or cur[2] ~= 'r' then
  return 0
end
redis.call('XADD', KEYS[2], 'MAXLEN', '1', '*', 'a', '')
redis.call('PEXPIRE', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[1])
return 1
