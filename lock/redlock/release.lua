-- release.lua: delete the lock if the caller owns it here, and raise this
-- instance's counter to the caller's highest fence, so that the instances'
-- counters stay equal.
--
-- KEYS[1] the lock   KEYS[2] this instance's fence counter (counter.lua)
-- ARGV[1] owner: "token:" to release whichever attempt of token holds it,
--         or "token:attempt" to undo that attempt only
-- ARGV[2] floor: the highest fence the caller has seen
--
-- Returns 1 released, 0 not the owner here.
raise(tonumber(ARGV[2]) or 0)
local v = redis.call('GET', KEYS[1])
local o = ARGV[1]
if v and (v == o or (string.sub(o, -1) == ':' and string.sub(v, 1, #o) == o)) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
