-- extend.lua: reset the caller's lease to ttl from now if it still owns the lock.
--
-- KEYS[1] L, the lock (see acquire.lua for its value)
-- ARGV[1] token   ARGV[2] ttl_ms
--
-- Returns 1 extended, 0 not the owner (nothing changed).
local L, token = KEYS[1], ARGV[1]
local v = redis.call('GET', L)
if not v then
  return 0
end
local o, e, grant = string.match(v, '^([^:]+):(%d+):(.*)$')
local t = redis.call('TIME')
local now_ms = math.floor((tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000)
if o ~= token or tonumber(e) <= now_ms then
  return 0
end
redis.call('SET', L, string.format('%s:%d:', token, now_ms + tonumber(ARGV[2])) .. grant, 'PX', 604800000)
return 1
