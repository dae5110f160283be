-- settle.lua: end holds and charge the actual usage, once per ID, for a
-- batch of settles of one window (concurrent Settle calls share a call).
--
-- KEYS[1..10] see common.lua
-- ARGV[1] keep_ms      unix ms until which the window's keys are kept
-- then 11 values per settle, in order:
--   id           reservation ID
--   tokens       charge: tokens (prompt + completion)
--   usd          charge: µUSD
--   prompt       usage row increments: prompt tokens,
--   completion   completion tokens,
--   cached       cached tokens
--   row          usage row ("<len(model)>:<model><deployment>")
--   remember_ms  the ID is remembered as settled this long
--   requests     how many requests the record stands for
--   learn_model  the model whose estimate learns from this answer,
--   learn        and the answer's completion tokens ("0": learn nothing)
--
-- A hold that was released is gone, but the charge still applies: the
-- provider billed the request. A hold that expired was charged its hold
-- (see sweep); while that charge is remembered, the settle replaces it.
-- A repeated settle learns nothing. The first waiter of the line is woken.
--
-- Returns, per settle in order, {applied, spent_tokens, spent_usd}
-- flattened: applied 1 charged now, 0 the ID was already settled (nothing
-- changed); the spend is the window's after that settle.
sweep()
local out = {}
local st, sm
local learn, models = {}, {} -- per model, the new samples in settle order
for i = 2, #ARGV, 11 do
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
    local model, n = ARGV[i + 9], tonumber(ARGV[i + 10])
    if n > 0 then
      if not learn[model] then
        learn[model] = {}
        models[#models + 1] = model
      end
      table.insert(learn[model], n)
    end
  end
  out[#out + 1] = st
  out[#out + 1] = sm
end
for _, model in ipairs(models) do
  learn_samples(model, learn[model])
end
keep(ARGV[1])
wake_head()
return out
