-- usage.lua: a window's usage rows, after sweeping expired holds (whose
-- charges are counted in the rows).
--
-- KEYS[1..10] see common.lua
-- (no ARGV)
--
-- Returns the usage hash as HGETALL does: field, value, field, value...
sweep()
return redis.call('HGETALL', KEYS[5])
