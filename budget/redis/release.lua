-- release.lua: end a hold without charging anything.
--
-- KEYS[1..5] totals, holds, expiry, settled, usage (see common.lua)
-- ARGV[1] id  reservation ID
--
-- Returns 1 if the hold existed, 0 if it was already settled, released or
-- expired (nothing changed).
sweep()
if free(ARGV[1]) then
  return 1
end
return 0
