-- extend.lua: keep an unsettled reservation and its permits alive.
--
-- KEYS[1] B (see lib.lua)
-- ARGV[1] request id   ARGV[2] hold ms from now
--
-- Returns 1 extended, 0 unknown or already settled.
local B, id, hold = KEYS[1], ARGV[1], tonumber(ARGV[2])
local S = new_state(B)
local st, raw = reservation(S, id)
if st ~= '0' then return 0 end
redis.call('PEXPIRE', B .. ':r:' .. id, hold)
local spec = cjson.decode(raw)
for _, c in ipairs(spec.c) do
  if c[1] == 'c' then
    local key = B .. ':c:' .. c[2]
    redis.call('ZADD', key, 'XX', S.now_ms + hold, id)
    if redis.call('PTTL', key) < hold + 1000 then redis.call('PEXPIRE', key, hold + 1000) end
  end
end
return 1
