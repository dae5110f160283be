-- learn.lua: record a provider's own limit for one rate bucket (see "Learned limits" in
-- lib.lua) and lower the bucket to what the provider says is left.
--
-- KEYS[1] B (see lib.lua)
-- ARGV[1] spec (binary, see lib.lua) with the one charge: the limit as charged
-- ARGV[2] the learned limit   ARGV[3] remaining (-1: not told)   ARGV[4] how long it holds, ms
--
-- Returns 1.
local B = KEYS[1]
local S = new_state(B)
local f = parse_spec(ARGV[1], 1)
local b = bucket(S, f, 5) -- brought up to now under what was in force
local ll, remaining = tonumber(ARGV[2]), tonumber(ARGV[3])
b.learned, b.learned_until = ll, S.now_us + tonumber(ARGV[4]) * 1000
b.rate, b.burst = learned_params(f, 5, ll)
if b.level > b.burst then b.level = b.burst end
if remaining >= 0 and b.level > remaining then b.level = remaining end
touch(S, b)
flush(S)
return 1
