-- extend.lua: keep an unsettled reservation and its permits alive, and
-- record what it has used so far.
--
-- KEYS[1] B (see lib.lua)
-- ARGV[1] request id   ARGV[2] hold ms from now
-- ARGV[3], ARGV[4], ... usage so far, one per charge in order (a missing one
--         counts as the reserved cost); none keeps what was recorded before
--
-- With usage, the reservation becomes "u..." and its spec and usage go to B:u,
-- its expiry to B:x, so that if it expires unsettled its rate charges are
-- settled at that usage (sweep_refunds in lib.lua).
--
-- Returns 1 extended, 0 unknown or already settled.
local B, id, hold = KEYS[1], ARGV[1], tonumber(ARGV[2])
local S = new_state(B)
local st, _, f, recorded, v = reservation(S, id)
if st ~= '0' then return 0 end
local rk, xk, uk = B .. ':r:' .. id, B .. ':x', B .. ':u'
local due = S.now_ms + hold
local longest = 0 -- the longest window, ms
for i = 1, f[2] do
  local k = 8 * i - 3
  if f[k + 1] == 'c' then
    local key = B .. ':c:' .. f[k + 2]
    redis.call('ZADD', key, 'XX', due, id)
    if redis.call('PTTL', key) < hold + 1000 then redis.call('PEXPIRE', key, hold + 1000) end
  elseif f[k + 6] / 1000 > longest then
    longest = f[k + 6] / 1000
  end
end
if #ARGV > 2 and not f.json then
  local used = {}
  for i = 1, f[2] do
    used[i] = struct.pack('<d', tonumber(ARGV[2 + i] or f[8 * i + 5]))
  end
  redis.call('HSET', uk, id, string.sub(v, 2, f[6 + 8 * f[2]] - 1) .. table.concat(used))
  redis.call('ZADD', xk, due, id)
  if not recorded then
    redis.call('SET', rk, 'u' .. string.sub(v, 2), 'PX', hold)
  else
    redis.call('PEXPIRE', rk, hold)
  end
  local x = tonumber(redis.call('HGET', B .. ':s', 'x'))
  if not x or x > due then redis.call('HSET', B .. ':s', 'x', string.format('%d', due)) end
  recorded = true
else
  redis.call('PEXPIRE', rk, hold)
  if recorded then redis.call('ZADD', xk, 'XX', due, id) end
end
if recorded then
  -- Kept until the buckets have refilled anyway, for a sweep to find.
  local ttl = math.ceil(hold + longest + 1000)
  for _, key in ipairs({xk, uk}) do
    if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
  end
end
return 1
