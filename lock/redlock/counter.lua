-- counter.lua: prepended to acquire.lua, raise.lua and release.lua.
--
-- KEYS[2] is this instance's fence counter for the lock KEYS[1]; it lives
-- 7 days after the last write.

-- counter returns the counter's value. A missing counter (a new lock, or an
-- instance restarted without persistence) reads as the server's clock in
-- µs: fences count up by one per acquisition from a clock reading, so
-- fewer than one per µs, and a clock reading taken later is above them all
-- (see the package documentation for what that assumes).
local function counter()
  local v = tonumber(redis.call('GET', KEYS[2]) or '')
  if v then return v end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- raise sets the counter to max(counter, v) and returns it.
local function raise(v)
  local c = counter()
  if v > c then c = v end
  redis.call('SET', KEYS[2], string.format('%d', c), 'PX', '604800000')
  return c
end
