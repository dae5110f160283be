-- extend.lua: reset the caller's lease to ttl from now if it still owns the lock.
--
-- KEYS[1] L, the lock (see acquire.lua for its two forms)
-- ARGV[1] token   ARGV[2] ttl_ms
--
-- Returns 1 extended, 0 not the owner (nothing changed).
local L, token = KEYS[1], ARGV[1]
local v = redis.call('GET', L)
if v == token then
  redis.call('PEXPIRE', L, ARGV[2])
  return 1
end
if not v or not string.find(v, ':', 1, true) then
  return 0
end
local o, e, rest = string.match(v, '^([^:]+):(%d+):(.*)$')
local now_ms = math.floor(time_us() / 1000)
if o ~= token or tonumber(e) <= now_ms then
  return 0
end
redis.call('SET', L, string.format('%s:%d:', token, now_ms + tonumber(ARGV[2])) .. rest, 'PX', '604800000')
return 1
