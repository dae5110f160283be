-- reserve.lua: admit a hold if it fits under every cap, atomically, and
-- if no one waits ahead of it in the window's line (with a waiter lease).
--
-- KEYS[1..10] see common.lua
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
-- ARGV[12] lease_ms     "0": one attempt, the line ignored; else the
--                       request waits its turn and its place lives this long
-- ARGV[13] model        the model whose learned estimate is returned
--
-- A capped dimension admits when spent + reserved + hold <= cap and
-- spent + reserved < cap. With a lease (see budget.Backend.Reserve): a
-- request behind live waiters takes or renews its place, unless it could
-- never fit; one first in line that fits is admitted and leaves the line,
-- waking the next; one that does not fit keeps a place if it may fit later
-- (something reserved where it is denied, and it fits once nothing is).
-- A denial changes nothing but the line (beyond sweeping).
--
-- Returns {status, spent_tokens, spent_usd, reserved_tokens, reserved_usd,
-- learned} with the totals after the call; status 1 admitted, 2 already
-- held under this ID (admitted, nothing taken), 0 denied, 3 ID already
-- settled (or expired and charged), 4 queued (not admitted, in line);
-- learned is the model's learned completion estimate, 0 if none.
sweep()
local id = ARGV[1]
local lease = tonumber(ARGV[12])
local st, sm, rt, rm = totals()
local learned = tonumber(redis.call('HGET', KEYS[10], 'e:' .. ARGV[13]) or '0')
if redis.call('ZSCORE', KEYS[4], id) then
  if lease > 0 then line_leave(id) end
  return {3, st, sm, rt, rm, learned}
end
if redis.call('HEXISTS', KEYS[2], id) == 1 then
  if lease > 0 then line_leave(id) end
  return {2, st, sm, rt, rm, learned}
end
local tok, usd = tonumber(ARGV[2]), tonumber(ARGV[3])
local cap_tok, cap_usd = tonumber(ARGV[4]), tonumber(ARGV[5])
local function fits(limit, used, need)
  return limit == 0 or (used + need <= limit and used < limit)
end
local ever = fits(cap_tok, st, tok) and fits(cap_usd, sm, usd)
if lease > 0 then
  local first = line_head()
  if first and first ~= id then
    if not ever then
      line_leave(id)
      return {0, st, sm, rt, rm, learned}
    end
    line_join(id, lease)
    return {4, st, sm, rt, rm, learned}
  end
end
local ok_tok, ok_usd = fits(cap_tok, st + rt, tok), fits(cap_usd, sm + rm, usd)
if not ok_tok or not ok_usd then
  if lease > 0 then
    if ever and (ok_tok or rt > 0) and (ok_usd or rm > 0) then
      line_join(id, lease)
      return {4, st, sm, rt, rm, learned}
    end
    line_leave(id)
  end
  return {0, st, sm, rt, rm, learned}
end
redis.call('HSET', KEYS[2], id, ARGV[2] .. ' ' .. ARGV[3])
redis.call('HSET', KEYS[6], id, ARGV[8] .. ' ' .. ARGV[9] .. ' ' .. ARGV[10] .. ' ' .. ARGV[11])
redis.call('ZADD', KEYS[3], int(now_ms + tonumber(ARGV[6])), id)
rt = redis.call('HINCRBY', KEYS[1], 'rt', ARGV[2])
rm = redis.call('HINCRBY', KEYS[1], 'rm', ARGV[3])
keep(ARGV[7])
if lease > 0 then line_leave(id) end
return {1, st, sm, rt, rm, learned}
