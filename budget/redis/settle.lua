-- settle.lua: end holds and charge the actual usage, once per ID, for a
-- batch of settles of one window (concurrent Settle calls share a call).
--
-- KEYS[1..7] see common.lua
-- ARGV[1] keep_ms      unix ms until which the window's keys are kept
-- then 9 values per settle, in order:
--   id           reservation ID
--   tokens       charge: tokens (prompt + completion)
--   usd          charge: µUSD
--   prompt       usage row increments: prompt tokens,
--   completion   completion tokens,
--   cached       cached tokens
--   row          usage row ("<len(model)>:<model><deployment>")
--   remember_ms  the ID is remembered as settled this long
--   requests     how many requests the record stands for
--
-- A hold that was released is gone, but the charge still applies: the
-- provider billed the request. A hold that expired was charged its hold
-- (see sweep); while that charge is remembered, the settle replaces it.
--
-- Returns, per settle in order, {applied, spent_tokens, spent_usd}
-- flattened: applied 1 charged now, 0 the ID was already settled (nothing
-- changed); the spend is the window's after that settle.
sweep()
local out = {}
local st, sm
for i = 2, #ARGV, 9 do
  local id, row = ARGV[i], ARGV[i + 6]
  if redis.call('ZSCORE', KEYS[4], id) and not unexpire(id) then
    if not st then st, sm = totals() end
    out[#out + 1] = 0
  else
    free(id)
    st, sm = spend(tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]))
    count(row, tonumber(ARGV[i + 8]), 0, tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]), tonumber(ARGV[i + 2]))
    redis.call('ZADD', KEYS[4], int(now_ms + tonumber(ARGV[i + 7])), id)
    out[#out + 1] = 1
  end
  out[#out + 1] = st
  out[#out + 1] = sm
end
keep(ARGV[1])
return out
