-- common.lua: prepended to every budget script (never run alone). It reads
-- the server clock and defines the helpers the scripts share.
--
-- Every script takes the same seven keys, all of one tenant and window and
-- all under one hash tag, so a script touches one Cluster slot:
--
-- KEYS[1] totals   hash: st, sm = spent tokens, µUSD; rt, rm = reserved tokens, µUSD
-- KEYS[2] holds    hash: reservation ID -> "<tokens> <µUSD>"
-- KEYS[3] expiry   zset: reservation ID, score = server ms when its hold expires
-- KEYS[4] settled  zset: settled (or expired and charged) reservation ID,
--                  score = server ms when it may be forgotten
-- KEYS[5] usage    hash: "<kind>:<row>" -> count, kind n (requests), p (prompt),
--                  c (completion), k (cached), m (µUSD), e (expired requests);
--                  row = "<byte length of model>:<model><deployment>"
-- KEYS[6] charges  hash: reservation ID -> what its live hold is charged if it
--                  expires, "<prompt> <completion> <remember ms> <row>"
-- KEYS[7] expired  hash: reservation ID -> the charge its expiry made,
--                  "<tokens> <µUSD> <prompt> <completion> <row>", while the
--                  ID is in settled (a late settle replaces it)
-- KEYS[8] line     zset: waiting requests' IDs, score = arrival order
-- KEYS[9] leases   zset: the same IDs, score = server ms when the place
--                  is dropped unless renewed
-- KEYS[10] learned hash: "s:<model>" -> recent answers' completion tokens,
--                  newest first, space-separated; "e:<model>" -> the
--                  estimate learned from them
-- and, not declared (same hash tag), <KEYS[1] without its "t">n:<id>, a
-- list a waiter blocks on (BLPOP) until it is woken.
--
-- (The holds hash keeps its two-number format, so that scripts of earlier
-- versions, which know only the first five keys, still read it.)
--
-- Time comes from the server only (redis.call('TIME')).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The most expired holds (and forgettable settled IDs) one call handles;
-- the rest follow in later calls (until then an expired hold counts as
-- reserved: the same total).
local SWEEP_MAX = 1000
-- Keys never expire sooner than this after a write, whatever the caller's
-- clock said the window's end is.
local MIN_KEEP_MS = 86400000
-- What a hold without a charge entry (reserved by an earlier version) is
-- charged as: its tokens as prompt tokens, in this row, remembered 15 min.
local UNKNOWN_ROW = '7:unknown'
local UNKNOWN_REMEMBER_MS = 900000

-- int renders a number for redis.call: Lua would turn 2^53 into
-- "9.007199254741e+15" and -0 into "-0", which Redis rejects as integers.
local function int(x)
  return string.format('%d', x)
end

-- fields splits s at its first n spaces: n numbers, then the rest (a row,
-- which may contain spaces).
local function fields(s, n)
  local out, pos = {}, 1
  for i = 1, n do
    local sp = string.find(s, ' ', pos, true)
    out[i] = tonumber(string.sub(s, pos, sp - 1))
    pos = sp + 1
  end
  out[n + 1] = string.sub(s, pos)
  return out
end

local function parse_hold(h)
  local sp = string.find(h, ' ', 1, true)
  return tonumber(string.sub(h, 1, sp - 1)), tonumber(string.sub(h, sp + 1))
end

-- count adds to a usage row: requests, expired requests, prompt,
-- completion, cached tokens, µUSD (negative to take back; a row whose
-- requests drop to 0 is removed).
local KINDS = {'n', 'e', 'p', 'c', 'k', 'm'}
local function count(row, n, e, p, c, k, m)
  local v = {n, e, p, c, k, m}
  for i = 1, #KINDS do
    if v[i] ~= 0 then redis.call('HINCRBY', KEYS[5], KINDS[i] .. ':' .. row, int(v[i])) end
  end
  if n < 0 and tonumber(redis.call('HGET', KEYS[5], 'n:' .. row) or '0') <= 0 then
    for i = 1, #KINDS do redis.call('HDEL', KEYS[5], KINDS[i] .. ':' .. row) end
  end
end

-- spend adds to the window's spend.
local function spend(tok, usd)
  local st = redis.call('HINCRBY', KEYS[1], 'st', int(tok))
  local sm = redis.call('HINCRBY', KEYS[1], 'sm', int(usd))
  return st, sm
end

-- charge_expired charges an expired hold: spend, its usage row (one
-- request, expired), and remembers the charge with the ID.
local function charge_expired(id, tok, usd)
  local info = redis.call('HGET', KEYS[6], id)
  local p, c, remember, row = tok, 0, UNKNOWN_REMEMBER_MS, UNKNOWN_ROW
  if info then
    local f = fields(info, 3)
    p, c, remember, row = f[1], f[2], f[3], f[4]
    redis.call('HDEL', KEYS[6], id)
  end
  spend(tok, usd)
  count(row, 1, 1, p, c, 0, usd)
  redis.call('HSET', KEYS[7], id, int(tok) .. ' ' .. int(usd) .. ' ' .. int(p) .. ' ' .. int(c) .. ' ' .. row)
  redis.call('ZADD', KEYS[4], int(now_ms + remember), id)
end

-- sweep charges expired holds and forgets settled IDs (and the charges of
-- expired ones) whose time has passed.
local function sweep()
  local ids = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', int(now_ms), 'LIMIT', 0, SWEEP_MAX)
  if #ids > 0 then
    local tok, usd = 0, 0
    for i = 1, #ids do
      local h = redis.call('HGET', KEYS[2], ids[i])
      if h then
        local a, b = parse_hold(h)
        tok, usd = tok + a, usd + b
        charge_expired(ids[i], a, b)
      end
    end
    redis.call('HDEL', KEYS[2], unpack(ids))
    redis.call('ZREM', KEYS[3], unpack(ids))
    if tok ~= 0 then redis.call('HINCRBY', KEYS[1], 'rt', int(-tok)) end
    if usd ~= 0 then redis.call('HINCRBY', KEYS[1], 'rm', int(-usd)) end
    -- Keys this may have created expire with the window's others.
    local ttl = redis.call('PTTL', KEYS[1])
    if ttl > 0 then
      for i = 4, 7 do redis.call('PEXPIRE', KEYS[i], ttl) end
    end
  end
  local old = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', int(now_ms), 'LIMIT', 0, SWEEP_MAX)
  if #old > 0 then
    redis.call('ZREM', KEYS[4], unpack(old))
    redis.call('HDEL', KEYS[7], unpack(old))
  end
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
  redis.call('HDEL', KEYS[6], id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('HINCRBY', KEYS[1], 'rt', int(-a))
  redis.call('HINCRBY', KEYS[1], 'rm', int(-b))
  return true
end

-- unexpire takes back the remembered charge of an expired hold, if there
-- is one, and reports whether there was.
local function unexpire(id)
  local x = redis.call('HGET', KEYS[7], id)
  if not x then return false end
  local f = fields(x, 4)
  spend(-f[1], -f[2])
  count(f[5], -1, -1, -f[3], -f[4], 0, -f[2])
  redis.call('HDEL', KEYS[7], id)
  return true
end

-- keep sets the window's keys (not its line, which lives by its leases)
-- to expire at keep_ms (the window's end plus its retention, by the
-- caller's clock), but not sooner than MIN_KEEP_MS.
local function keep(keep_ms)
  local at = math.max(tonumber(keep_ms), now_ms + MIN_KEEP_MS)
  for i = 1, 7 do
    redis.call('PEXPIREAT', KEYS[i], int(at))
  end
  redis.call('PEXPIREAT', KEYS[10], int(at))
end

-- The waiting line. LINE_SCAN bounds the expired places one call drops.
local LINE_SCAN = 64
-- How long a wake-up waits for its waiter: it is taken within the
-- waiter's lease, or deleted when the waiter leaves.
local WAKE_TTL_MS = 60000

local function wake_key(id)
  return string.sub(KEYS[1], 1, -2) .. 'n:' .. id
end

-- line_drop takes id out of the line (and its wake-up with it).
local function line_drop(id)
  redis.call('ZREM', KEYS[8], id)
  redis.call('ZREM', KEYS[9], id)
  redis.call('DEL', wake_key(id))
end

-- line_head returns the first live waiter (nil if none), dropping those
-- whose lease has passed: they died, or gave up without leaving.
local function line_head()
  for _ = 1, LINE_SCAN do
    local first = redis.call('ZRANGE', KEYS[8], 0, 0)[1]
    if not first then return nil end
    if tonumber(redis.call('ZSCORE', KEYS[9], first) or '0') > now_ms then
      return first
    end
    line_drop(first)
  end
  return nil
end

-- line_join puts id at the end of the line, or renews its place.
local function line_join(id, lease_ms)
  if not redis.call('ZSCORE', KEYS[8], id) then
    local last = redis.call('ZRANGE', KEYS[8], -1, -1, 'WITHSCORES')
    local seq = 1
    if last[2] then seq = tonumber(last[2]) + 1 end
    redis.call('ZADD', KEYS[8], seq, id)
  end
  redis.call('ZADD', KEYS[9], int(now_ms + lease_ms), id)
  for i = 8, 9 do
    if redis.call('PTTL', KEYS[i]) < 2 * lease_ms then
      redis.call('PEXPIRE', KEYS[i], int(2 * lease_ms))
    end
  end
end

-- wake_head tells the first live waiter that its turn may have come.
local function wake_head()
  local first = line_head()
  if first then
    local k = wake_key(first)
    if redis.call('LLEN', k) == 0 then
      redis.call('RPUSH', k, '1')
      redis.call('PEXPIRE', k, WAKE_TTL_MS)
    end
  end
end

-- line_leave takes id out of the line; if it was first, the next is woken.
local function line_leave(id)
  local first = line_head()
  if not first then return end
  line_drop(id)
  if first == id then wake_head() end
end

-- Learned completion estimates, as budget.LearnedEstimate computes them:
-- the LEARN_PERCENTILE-th percentile (nearest rank) of the last
-- LEARN_WINDOW answers, once there are LEARN_MIN_SAMPLES.
local LEARN_WINDOW, LEARN_MIN_SAMPLES, LEARN_PERCENTILE = 64, 8, 98

-- learn_samples adds new answers' sizes (oldest first) to model's samples
-- and stores the estimate they give.
local function learn_samples(model, new)
  local s = {}
  for i = #new, 1, -1 do
    s[#s + 1] = new[i]
  end
  local old = redis.call('HGET', KEYS[10], 's:' .. model)
  if old then
    for v in string.gmatch(old, '%d+') do
      if #s >= LEARN_WINDOW then break end
      s[#s + 1] = tonumber(v)
    end
  end
  while #s > LEARN_WINDOW do
    table.remove(s)
  end
  local text = {}
  for i = 1, #s do
    text[i] = int(s[i])
  end
  redis.call('HSET', KEYS[10], 's:' .. model, table.concat(text, ' '))
  if #s >= LEARN_MIN_SAMPLES then
    table.sort(s)
    local rank = math.floor((LEARN_PERCENTILE * #s + 99) / 100)
    redis.call('HSET', KEYS[10], 'e:' .. model, int(math.max(s[rank], 1)))
  end
end
