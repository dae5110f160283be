-- raise.lua: the second round of an acquisition whose quorum answered
-- different fences: raise this instance's counter to the fence chosen (the
-- highest answer), and confirm the lock is still this attempt's here.
--
-- KEYS[1] the lock   KEYS[2] this instance's fence counter (counter.lua)
-- ARGV[1] "token:attempt"   ARGV[2] fence
--
-- Returns 1 if the attempt still owns the lock here, else 0; the counter is
-- raised either way (always safe: fences only need to grow).
raise(tonumber(ARGV[2]) or 0)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return 1
end
return 0
