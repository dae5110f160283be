-- reserve.lua: admit a hold if it fits under every cap, atomically.
--
-- KEYS[1..7] see common.lua
-- ARGV[1]  id           reservation ID
-- ARGV[2]  tokens       hold: tokens
-- ARGV[3]  usd          hold: µUSD
-- ARGV[4]  cap_tokens   token cap; "0" = none
-- ARGV[5]  cap_usd      money cap in µUSD; "0" = none
-- ARGV[6]  ttl_ms       the hold expires this long after now (server time)
-- ARGV[7]  keep_ms      unix ms until which the window's keys are kept
-- ARGV[8]  prompt       if it expires: prompt tokens counted in the row,
-- ARGV[9]  completion   completion tokens,
-- ARGV[10] remember_ms  how long its charge is remembered,
-- ARGV[11] row          the usage row ("<len(model)>:<model><deployment>")
--
-- A capped dimension admits when spent + reserved + hold <= cap and
-- spent + reserved < cap. A denial changes nothing (beyond sweeping).
--
-- Returns {status, spent_tokens, spent_usd, reserved_tokens, reserved_usd}
-- with the totals after the call; status 1 admitted, 2 already held under
-- this ID (admitted, nothing taken), 0 denied, 3 ID already settled (or
-- expired and charged).
sweep()
local id = ARGV[1]
local st, sm, rt, rm = totals()
if redis.call('ZSCORE', KEYS[4], id) then
  return {3, st, sm, rt, rm}
end
if redis.call('HEXISTS', KEYS[2], id) == 1 then
  return {2, st, sm, rt, rm}
end
local tok, usd = tonumber(ARGV[2]), tonumber(ARGV[3])
local function fits(limit, used, need)
  return limit == 0 or (used + need <= limit and used < limit)
end
if not fits(tonumber(ARGV[4]), st + rt, tok) or not fits(tonumber(ARGV[5]), sm + rm, usd) then
  return {0, st, sm, rt, rm}
end
redis.call('HSET', KEYS[2], id, ARGV[2] .. ' ' .. ARGV[3])
redis.call('HSET', KEYS[6], id, ARGV[8] .. ' ' .. ARGV[9] .. ' ' .. ARGV[10] .. ' ' .. ARGV[11])
redis.call('ZADD', KEYS[3], int(now_ms + tonumber(ARGV[6])), id)
rt = redis.call('HINCRBY', KEYS[1], 'rt', ARGV[2])
rm = redis.call('HINCRBY', KEYS[1], 'rm', ARGV[3])
keep(ARGV[7])
return {1, st, sm, rt, rm}
