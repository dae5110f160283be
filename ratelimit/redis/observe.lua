-- observe.lua: lower a rate bucket to what the provider says is left.
--
-- KEYS[1] B (see lib.lua)
-- ARGV[1] spec (binary, see lib.lua) with the one charge to adjust   ARGV[2] remaining
--
-- Returns 1 if the bucket was lowered, 0 if it already had no more.
local B = KEYS[1]
local S = new_state(B)
local f = parse_spec(ARGV[1], 1)
local b = bucket(S, f, 5)
local remaining = tonumber(ARGV[2])
if b.level <= remaining then return 0 end
b.level = remaining
touch(S, b)
flush(S)
return 1
