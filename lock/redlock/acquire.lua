-- acquire.lua: take the lock on this instance if it is free, and mint this
-- instance's fence for the acquisition.
--
-- KEYS[1] the lock: "token:attempt" (the owner's token and which of its
--         attempts set it), with the lease as its TTL
-- KEYS[2] this instance's fence counter for the lock (counter.lua)
-- ARGV[1] "token:attempt"   ARGV[2] ttl_ms
-- ARGV[3] floor: the highest fence the caller has seen
-- ARGV[4] token
--
-- Returns the fence, max(counter, floor) + 1, if taken; 0 if held. A key
-- left by an earlier attempt of the same acquisition (its answer was lost
-- or came too late) counts as free.
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local v = redis.call('GET', KEYS[1])
  if not v or string.sub(v, 1, #ARGV[4] + 1) ~= ARGV[4] .. ':' then
    return 0
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
local c = counter()
local floor = tonumber(ARGV[3]) or 0
if floor > c then c = floor end
return raise(c + 1)
