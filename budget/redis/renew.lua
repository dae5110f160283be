-- renew.lua: extend a live hold and raise it to what its request has used
-- so far.
--
-- KEYS[1..10] see common.lua
-- ARGV[1] id          reservation ID
-- ARGV[2] ttl_ms      the hold now expires this long after now (server time)
-- ARGV[3] tokens      hold: at least this many tokens
-- ARGV[4] usd         hold: at least this many µUSD
-- ARGV[5] prompt      if it expires: at least this many prompt tokens,
-- ARGV[6] completion  and completion tokens, counted in the row
-- ARGV[7] row         the usage row; "" keeps the hold's
-- ARGV[8] keep_ms     unix ms until which the window's keys are kept
--
-- Amounts only grow (each the larger of the hold's and the argument's), so
-- renewals may arrive in any order. The reserved total grows with the
-- hold, even past a cap: those tokens were used.
--
-- Returns 1 if the hold was live and is renewed, 0 if there is none
-- (settled, released, or expired and charged): nothing changed.
sweep()
local id = ARGV[1]
local h = redis.call('HGET', KEYS[2], id)
if not h then
  return 0
end
local a, b = parse_hold(h)
local na, nb = math.max(a, tonumber(ARGV[3])), math.max(b, tonumber(ARGV[4]))
if na ~= a or nb ~= b then
  redis.call('HSET', KEYS[2], id, int(na) .. ' ' .. int(nb))
  redis.call('HINCRBY', KEYS[1], 'rt', int(na - a))
  redis.call('HINCRBY', KEYS[1], 'rm', int(nb - b))
end
local p, c, remember, row = 0, 0, UNKNOWN_REMEMBER_MS, UNKNOWN_ROW
local info = redis.call('HGET', KEYS[6], id)
if info then
  local f = fields(info, 3)
  p, c, remember, row = f[1], f[2], f[3], f[4]
end
p, c = math.max(p, tonumber(ARGV[5])), math.max(c, tonumber(ARGV[6]))
if ARGV[7] ~= '' then row = ARGV[7] end
redis.call('HSET', KEYS[6], id, int(p) .. ' ' .. int(c) .. ' ' .. int(remember) .. ' ' .. row)
redis.call('ZADD', KEYS[3], int(now_ms + tonumber(ARGV[2])), id)
keep(ARGV[8])
return 1
