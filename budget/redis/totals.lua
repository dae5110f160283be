-- totals.lua: a window's spend and live holds, after sweeping expired ones.
--
-- KEYS[1..10] see common.lua
-- (no ARGV)
--
-- Returns {spent_tokens, spent_usd, reserved_tokens, reserved_usd, holds}.
sweep()
local st, sm, rt, rm = totals()
return {st, sm, rt, rm, redis.call('HLEN', KEYS[2])}
