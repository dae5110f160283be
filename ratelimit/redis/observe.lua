-- observe.lua: lower a rate bucket to what the provider says is left.
--
-- KEYS[1] B (see lib.lua)
-- ARGV[1] spec (JSON) with the one charge to adjust   ARGV[2] remaining
--
-- Returns 1 if the bucket was lowered, 0 if it already had no more.
local B = KEYS[1]
local S = new_state(B)
local spec = cjson.decode(ARGV[1])
local b = bucket(S, spec.c[1])
local remaining = tonumber(ARGV[2])
if b.level <= remaining then return 0 end
b.level = remaining
b.dirty = true
flush(S)
return 1
