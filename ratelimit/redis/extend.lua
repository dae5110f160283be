-- extend.lua: keep an unsettled reservation and its permits alive.
--
-- KEYS[1] B (see lib.lua)
-- ARGV[1] request id   ARGV[2] hold ms from now
--
-- Returns 1 extended, 0 unknown or already settled.
local B, id, hold = KEYS[1], ARGV[1], tonumber(ARGV[2])
local S = new_state(B)
local st, _, f = reservation(S, id)
if st ~= '0' then return 0 end
redis.call('PEXPIRE', B .. ':r:' .. id, hold)
for i = 1, f[2] do
  local k = 8 * i - 3
  if f[k + 1] == 'c' then
    local key = B .. ':c:' .. f[k + 2]
    redis.call('ZADD', key, 'XX', S.now_ms + hold, id)
    if redis.call('PTTL', key) < hold + 1000 then redis.call('PEXPIRE', key, hold + 1000) end
  end
end
return 1
