-- common.lua: prepended to every budget script (never run alone). It reads
-- the server clock and defines the helpers the scripts share.
--
-- Every script takes the same five keys, all of one tenant and window and
-- all under one hash tag, so a script touches one Cluster slot:
--
-- KEYS[1] totals   hash: st, sm = spent tokens, µUSD; rt, rm = reserved tokens, µUSD
-- KEYS[2] holds    hash: reservation ID -> "<tokens> <µUSD>"
-- KEYS[3] expiry   zset: reservation ID, score = server ms when its hold expires
-- KEYS[4] settled  zset: settled reservation ID, score = server ms when it may be forgotten
-- KEYS[5] usage    hash: "<kind>:<row>" -> count, kind n (requests), p (prompt),
--                  c (completion), k (cached), m (µUSD);
--                  row = "<byte length of model>:<model><deployment>"
--
-- Time comes from the server only (redis.call('TIME')).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The most expired holds one call returns to the budget; the rest follow
-- in later calls (until then they count as reserved: conservative).
local SWEEP_MAX = 1000
-- Keys never expire sooner than this after a write, whatever the caller's
-- clock said the window's end is.
local MIN_KEEP_MS = 86400000

-- int renders a number for redis.call: Lua would turn 2^53 into
-- "9.007199254741e+15" and -0 into "-0", which Redis rejects as integers.
local function int(x)
  return string.format('%d', x)
end

local function parse_hold(h)
  local sp = string.find(h, ' ', 1, true)
  return tonumber(string.sub(h, 1, sp - 1)), tonumber(string.sub(h, sp + 1))
end

-- sweep returns expired holds to the budget and forgets settled IDs whose
-- window has passed.
local function sweep()
  local ids = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', int(now_ms), 'LIMIT', 0, SWEEP_MAX)
  if #ids > 0 then
    local tok, usd = 0, 0
    for i = 1, #ids do
      local h = redis.call('HGET', KEYS[2], ids[i])
      if h then
        local a, b = parse_hold(h)
        tok, usd = tok + a, usd + b
      end
    end
    redis.call('HDEL', KEYS[2], unpack(ids))
    redis.call('ZREM', KEYS[3], unpack(ids))
    if tok ~= 0 then redis.call('HINCRBY', KEYS[1], 'rt', int(-tok)) end
    if usd ~= 0 then redis.call('HINCRBY', KEYS[1], 'rm', int(-usd)) end
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', int(now_ms))
end

-- totals returns spent tokens, spent µUSD, reserved tokens, reserved µUSD.
local function totals()
  local v = redis.call('HMGET', KEYS[1], 'st', 'sm', 'rt', 'rm')
  return tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or 0, tonumber(v[4]) or 0
end

-- free ends a hold, if it exists, and reports whether it did.
local function free(id)
  local h = redis.call('HGET', KEYS[2], id)
  if not h then return false end
  local a, b = parse_hold(h)
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('HINCRBY', KEYS[1], 'rt', int(-a))
  redis.call('HINCRBY', KEYS[1], 'rm', int(-b))
  return true
end

-- keep sets every key to expire at keep_ms (the window's end plus its
-- retention, by the caller's clock), but not sooner than MIN_KEEP_MS.
local function keep(keep_ms)
  local at = math.max(tonumber(keep_ms), now_ms + MIN_KEEP_MS)
  for i = 1, 5 do
    redis.call('PEXPIREAT', KEYS[i], int(at))
  end
end
