-- settle.lua: settle, refund or abandon a request.
--
-- KEYS[1] B (see lib.lua)
-- ARGV[1] request id
-- ARGV[2] "s" to settle with the actual costs ARGV[4], ARGV[5], ... (one per
--         charge, in order; a missing one keeps the reserved cost), or "" to
--         refund everything
-- ARGV[3] lane to leave (abandon: the waiter gives up), or ""
--
-- Returns 0 unknown reservation, 1 settled, 2 already settled.
local B, id = KEYS[1], ARGV[1]
local S = new_state(B)
if ARGV[3] ~= '' then
  dequeue(S, ARGV[3], id)
  redis.call('DEL', B .. ':n:' .. id)
end
local actual = nil
if ARGV[2] ~= '' then
  actual = {}
  for i = 4, #ARGV do actual[i - 3] = ARGV[i] end
end
return settle(S, id, actual)
