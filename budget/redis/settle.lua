-- settle.lua: end a hold and charge the actual usage, once per ID.
--
-- KEYS[1..5] totals, holds, expiry, settled, usage (see common.lua)
-- ARGV[1] id           reservation ID
-- ARGV[2] tokens       charge: tokens (prompt + completion)
-- ARGV[3] usd          charge: µUSD
-- ARGV[4] prompt       usage row increments: prompt tokens,
-- ARGV[5] completion   completion tokens,
-- ARGV[6] cached       cached tokens
-- ARGV[7] row          usage row ("<len(model)>:<model><deployment>")
-- ARGV[8] remember_ms  the ID is remembered as settled this long
-- ARGV[9] keep_ms      unix ms until which the window's keys are kept
--
-- A hold that expired or was released is gone, but the charge still
-- applies: the provider billed the request.
--
-- Returns {applied, spent_tokens, spent_usd}: applied 1 charged now, 0 the
-- ID was already settled (nothing changed).
sweep()
local id = ARGV[1]
if redis.call('ZSCORE', KEYS[4], id) then
  local st, sm = totals()
  return {0, st, sm}
end
free(id)
local st = redis.call('HINCRBY', KEYS[1], 'st', ARGV[2])
local sm = redis.call('HINCRBY', KEYS[1], 'sm', ARGV[3])
local row = ARGV[7]
redis.call('HINCRBY', KEYS[5], 'n:' .. row, 1)
redis.call('HINCRBY', KEYS[5], 'p:' .. row, ARGV[4])
redis.call('HINCRBY', KEYS[5], 'c:' .. row, ARGV[5])
redis.call('HINCRBY', KEYS[5], 'k:' .. row, ARGV[6])
redis.call('HINCRBY', KEYS[5], 'm:' .. row, ARGV[3])
redis.call('ZADD', KEYS[4], int(now_ms + tonumber(ARGV[8])), id)
keep(ARGV[9])
return {1, st, sm}
