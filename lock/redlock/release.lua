-- release.lua: delete the lock if the caller owns it here, and raise this
-- instance's counter to the caller's highest fence, so that the instances'
-- counters stay equal and the next acquisition needs one round only.
--
-- KEYS[1] the lock   KEYS[2] this instance's fence counter (counter.lua)
-- ARGV[1] token      ARGV[2] floor: the highest fence the caller has seen
--
-- Returns 1 released, 0 not the owner here.
raise(tonumber(ARGV[2]) or 0)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
