-- release.lua: end a hold without charging anything, or take back the
-- charge its expiry made.
--
-- KEYS[1..10] see common.lua
-- ARGV[1] id  reservation ID
--
-- A hold that expired was charged (see sweep); while that charge is
-- remembered, releasing takes it back and forgets the ID, so that a later
-- settle is charged like any settle of a released hold. Either way the
-- first waiter of the line is woken.
--
-- Returns 1 if the hold, or its expiry's charge, existed; 0 if it was
-- already settled or released (nothing changed).
sweep()
if free(ARGV[1]) then
  wake_head()
  return 1
end
if unexpire(ARGV[1]) then
  redis.call('ZREM', KEYS[4], ARGV[1])
  wake_head()
  return 1
end
return 0
