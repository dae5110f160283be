-- cooldown.lua: hold back every charge on a scope until now + d; never
-- shortens a cooldown already in force.
--
-- KEYS[1] B (see lib.lua)
-- ARGV[1] scope   ARGV[2] d in ms
--
-- Returns the cooldown left, in ms.
local B, scope, d = KEYS[1], ARGV[1], tonumber(ARGV[2])
local S = new_state(B)
local key, field = B .. ':s', 'cd:' .. scope
local want = S.now_us + d * 1000
local cur = tonumber(redis.call('HGET', key, field) or '0')
if cur >= want then
  return math.ceil((cur - S.now_us) / 1000)
end
redis.call('HSET', key, field, string.format('%d', want))
return d
