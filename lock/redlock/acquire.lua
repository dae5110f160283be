-- acquire.lua: take the lock on this instance if it is free, and mint this
-- instance's fence for the acquisition.
--
-- KEYS[1] the lock: the owner's token, with the lease as its TTL
-- KEYS[2] this instance's fence counter for the lock (counter.lua)
-- ARGV[1] token   ARGV[2] ttl_ms
-- ARGV[3] floor: the highest fence the caller has seen
--
-- Returns the fence, max(counter, floor) + 1, if taken; 0 if held.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 0
end
local c = counter()
local floor = tonumber(ARGV[3]) or 0
if floor > c then c = floor end
return raise(c + 1)
