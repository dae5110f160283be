-- lib.lua: functions shared by the limiter's scripts; prepended to each.
--
-- Every key lives under B = KEYS[1] = "<prefix>{<group>}", one Cluster slot:
--   B:s                hash  shared state, read and written in one call per decision:
--                            b:<scope>:<r|t>:<window_us> -> rate bucket "level updated_us"
--                            cd:<scope> -> cooldown end (µs)
--                      A bucket's stored level only matters until it has refilled; a stale
--                      field reads as a full bucket. Fields number one per configured limit.
--   B:c:<scope>        zset  concurrency permits: member = reservation id, score = expiry (ms)
--   B:q:<lane>         zset  waiters: member = request id, score = priority * 1e13 + arrival seq
--   B:ql:<lane>        zset  waiters' leases: member = request id, score = expiry (ms)
--   B:e:<id>           string a queued request's spec (JSON)
--   B:r:<id>           string reservation "state\nspec\ndecision", state 0 held / 1 settled
--   B:n:<id>           list  wake-up of a waiter: its decision is pushed here
--   B:bl:<scope>       set   lanes whose waiters are blocked on scope
--   B:h:<lane>         hash  waiter id -> when it was last told it would fit (µs)
--   B:seq              string arrival sequence
-- A spec is {"c": [[kind, scope, limit, window_us, burst, cost], ...], "h": hold_ms,
-- "l": lane, "x": defer_us} with kind "r" (requests), "t" (tokens) or "c"
-- (concurrency); defer_us is how far ahead of its tokens the request may be
-- admitted (it is then told to start later).
-- A decision is the string "a w d r1 s1 r2 s2 ..." of integers: admitted (1|0),
-- wait_us (when refused: -1 unknown; when admitted: how long to hold off before
-- starting, for a deferred admission), index of the first refusing charge (0 none), then per
-- charge remaining and reset_ms. Integers, not JSON: cjson would print large
-- numbers with 14 significant digits. A wake-up list carries the waiter's
-- decision when it is admitted, or a hint "0 wait_us d" when it became the
-- first in its lane that cannot go yet.
-- Time comes from the server only.
local MAXSCAN = 64  -- waiters examined per walk of a lane
local MAXLANES = 32 -- lanes walked after a settle (the rest keep their mark for the next)

local function new_state(B)
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return {B = B, now_us = us, now_ms = math.floor(us / 1000), buckets = {}, permits = {}, cooldowns = {}}
end

-- limit_id names one limit: two limits of one kind on one scope (RPM and
-- RPD, say) differ by window.
local function limit_id(c)
  return c[1] .. ':' .. string.format('%d', c[4]) .. ':' .. c[2]
end

local function bucket_key(S, c)
  return 'b:' .. c[2] .. ':' .. c[1] .. ':' .. string.format('%d', c[4])
end

local function new_bucket(S, c, key, v)
  local rate = c[3] / c[4] -- units per µs
  local burst = c[5]
  local level = burst
  if v then
    local l, t = string.match(v, '^(%S+) (%d+)$')
    if l then
      level = tonumber(l) + (S.now_us - tonumber(t)) * rate
      if level > burst then level = burst end
    end
  end
  local b = {key = key, level = level, rate = rate, burst = burst, dirty = false}
  S.buckets[key] = b
  return b
end

-- prefetch reads, in one call, every bucket and cooldown of spec that this
-- run has not read yet.
local function prefetch(S, spec)
  local fields, what = {}, {}
  for _, c in ipairs(spec.c) do
    if c[1] ~= 'c' then
      local key = bucket_key(S, c)
      if not S.buckets[key] and not what[key] then
        fields[#fields + 1] = key
        what[key] = c
      end
    end
    if S.cooldowns[c[2]] == nil and not what['cd:' .. c[2]] then
      fields[#fields + 1] = 'cd:' .. c[2]
      what['cd:' .. c[2]] = c[2]
    end
  end
  if #fields == 0 then return end
  local vals = redis.call('HMGET', S.B .. ':s', unpack(fields))
  for i, f in ipairs(fields) do
    local x = what[f]
    if type(x) == 'string' then
      S.cooldowns[x] = tonumber(vals[i] or '0')
    else
      new_bucket(S, x, f, vals[i])
    end
  end
end

local function bucket(S, c)
  local key = bucket_key(S, c)
  local b = S.buckets[key]
  if b then return b end
  return new_bucket(S, c, key, redis.call('HGET', S.B .. ':s', key))
end

local function permits(S, c)
  local key = S.B .. ':c:' .. c[2]
  local p = S.permits[key]
  if p then return p end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', S.now_ms)
  p = {key = key, count = redis.call('ZCARD', key), limit = c[3], hold = 0, free_at = nil}
  S.permits[key] = p
  return p
end

local function cooldown_end(S, scope)
  local v = S.cooldowns[scope]
  if v == nil then
    v = tonumber(redis.call('HGET', S.B .. ':s', 'cd:' .. scope) or '0')
    S.cooldowns[scope] = v
  end
  return v
end

-- evaluate reports whether spec fits now. blocked holds "kind:scope" limits
-- that waiters ahead are stuck on; they refuse too, so nobody jumps the queue
-- on a limit. Returns ok, wait_us (-1 = unknown), first refusing index, and
-- the list of refusing charges.
local function evaluate(S, spec, blocked)
  prefetch(S, spec)
  local ok, wait, first, refused = true, 0, 0, {}
  local deferable = true -- refused only for tokens not there yet
  for i, c in ipairs(spec.c) do
    local w = nil
    local cd = cooldown_end(S, c[2])
    if cd > S.now_us then w, deferable = cd - S.now_us, false end
    if blocked[limit_id(c)] then w, deferable = -1, false end
    if c[1] == 'c' then
      local p = permits(S, c)
      if p.count + 1 > p.limit then
        deferable = false
        -- Full: at the latest, a slot frees when the earliest permit that
        -- must go expires (a release frees one sooner, and wakes us).
        if p.free_at == nil then
          local r = redis.call('ZRANGE', p.key, p.count - p.limit, p.count - p.limit, 'WITHSCORES')
          p.free_at = tonumber(r[2] or S.now_ms)
        end
        local need = math.max(p.free_at - S.now_ms, 1) * 1000
        if w == nil or (w >= 0 and need > w) then w = need end
      end
    else
      local b = bucket(S, c)
      if b.level < c[6] then
        local need = (c[6] - b.level) / b.rate
        if w == nil or (w >= 0 and need > w) then w = need end
      end
    end
    if w ~= nil then
      ok = false
      if first == 0 then first = i end
      refused[#refused + 1] = c
      if w < 0 or wait < 0 then wait = -1 elseif w > wait then wait = w end
    end
  end
  if ok then wait = 0 end
  if not ok and deferable and wait >= 0 and wait <= (spec.x or 0) then
    -- Admit now, to start when the tokens exist: the bucket goes below
    -- zero by what it lends, so the schedule stays exact and wake-up
    -- latency costs no capacity.
    return true, math.ceil(wait), 0, {}
  end
  return ok, math.ceil(wait), first, refused
end

local function charge(S, spec, id)
  for _, c in ipairs(spec.c) do
    if c[1] == 'c' then
      local p = permits(S, c)
      redis.call('ZADD', p.key, S.now_ms + spec.h, id)
      p.count = p.count + 1
      if spec.h > p.hold then p.hold = spec.h end
    else
      local b = bucket(S, c)
      b.level = b.level - c[6]
      b.dirty = true
    end
  end
end

local function decision(S, spec, ok, wait, first)
  local a = 0
  if ok then a = 1 end
  local out = {string.format('%d %d %d', a, wait, first)}
  for i, c in ipairs(spec.c) do
    local rem, reset = 0, 0
    if c[1] == 'c' then
      local p = permits(S, c)
      rem = math.max(p.limit - p.count, 0)
    else
      local b = bucket(S, c)
      rem = math.max(math.floor(b.level), 0)
      reset = math.max(math.ceil((b.burst - b.level) / b.rate / 1000), 0)
    end
    out[i + 1] = string.format('%d %d', rem, reset)
  end
  return table.concat(out, ' ')
end

-- flush writes back, in one call, the buckets this run changed.
local function flush(S)
  local args = {}
  for _, b in pairs(S.buckets) do
    if b.dirty then
      args[#args + 1] = b.key
      args[#args + 1] = string.format('%.17g %d', b.level, S.now_us)
      b.dirty = false
    end
  end
  if #args > 0 then
    redis.call('HSET', S.B .. ':s', unpack(args))
  end
  for _, p in pairs(S.permits) do
    if p.hold > 0 and redis.call('PTTL', p.key) < p.hold + 1000 then
      redis.call('PEXPIRE', p.key, p.hold + 1000)
    end
  end
end

local function reserve(S, id, raw, spec, d)
  redis.call('SET', S.B .. ':r:' .. id, '0\n' .. raw .. '\n' .. d, 'PX', spec.h)
end

-- reservation returns state, spec (raw) and decision of reservation id.
local function reservation(S, id)
  local v = redis.call('GET', S.B .. ':r:' .. id)
  if not v then return nil end
  return string.match(v, '^(%d)\n(.*)\n([^\n]*)$')
end

local function dequeue(S, lane, id)
  redis.call('ZREM', S.B .. ':q:' .. lane, id)
  redis.call('ZREM', S.B .. ':ql:' .. lane, id)
  redis.call('HDEL', S.B .. ':h:' .. lane, id)
  redis.call('DEL', S.B .. ':e:' .. id)
end

-- hint tells the first waiter of a lane that cannot go yet when it will fit,
-- so it sleeps exactly that long; it is told again only if that time moves.
local function hint(S, lane, id, spec, wait, first)
  local hk = S.B .. ':h:' .. lane
  local target = S.now_us + wait
  local prev = tonumber(redis.call('HGET', hk, id) or '0')
  if math.abs(prev - target) <= 1000 then return end
  redis.call('HSET', hk, id, string.format('%d', target))
  redis.call('PEXPIRE', hk, 60000)
  local nk = S.B .. ':n:' .. id
  redis.call('RPUSH', nk, string.format('0 %d %d', wait, first))
  redis.call('PEXPIRE', nk, spec.h)
end

-- walk admits, in order, every waiter of lane that fits, and wakes each on
-- its own list (except self, whose result is returned instead:
-- {admitted, decision, wait_us} or nil if self was not examined).
local function walk(S, lane, self)
  local q, ql = S.B .. ':q:' .. lane, S.B .. ':ql:' .. lane
  local ids = redis.call('ZRANGE', q, 0, MAXSCAN - 1)
  local blocked, mine, headed = {}, nil, false
  for _, id in ipairs(ids) do
    local raw = redis.call('GET', S.B .. ':e:' .. id)
    if not raw or tonumber(redis.call('ZSCORE', ql, id) or '0') <= S.now_ms then
      dequeue(S, lane, id) -- a waiter that died (or gave up) while queued
    else
      local spec = cjson.decode(raw)
      local ok, wait, first, refused = evaluate(S, spec, blocked)
      if ok then
        charge(S, spec, id)
        local d = decision(S, spec, true, wait, 0)
        dequeue(S, lane, id)
        reserve(S, id, raw, spec, d)
        if id == self then
          mine = {true, d, 0}
        else
          local nk = S.B .. ':n:' .. id
          redis.call('RPUSH', nk, d)
          redis.call('PEXPIRE', nk, spec.h)
        end
      else
        for _, c in ipairs(refused) do
          blocked[limit_id(c)] = true
          local bl = S.B .. ':bl:' .. c[2]
          redis.call('SADD', bl, lane)
          redis.call('PEXPIRE', bl, 60000)
        end
        if id == self then
          mine = {false, decision(S, spec, false, wait, first), wait}
        elseif not headed and wait > 0 then
          hint(S, lane, id, spec, wait, first)
        end
        headed = true
      end
    end
  end
  return mine
end

-- settle applies the real costs (actual = nil refunds everything), frees
-- permits and then walks the lanes that may now have room.
-- Returns 0 unknown reservation, 1 settled, 2 already settled.
local function settle(S, id, actual)
  local rk = S.B .. ':r:' .. id
  local st, raw, d = reservation(S, id)
  if not st then return 0 end
  if st == '1' then return 2 end
  local spec = cjson.decode(raw)
  local lanes, seen = {spec.l}, {[spec.l] = true}
  for i, c in ipairs(spec.c) do
    if c[1] == 'c' then
      redis.call('ZREM', S.B .. ':c:' .. c[2], id)
      S.permits[S.B .. ':c:' .. c[2]] = nil
    else
      local a = 0
      if actual then a = tonumber(actual[i] or c[6]) end
      local b = bucket(S, c)
      b.level = b.level - (a - c[6])
      if b.level > b.burst then b.level = b.burst end
      b.dirty = true
    end
    local bl = S.B .. ':bl:' .. c[2]
    for _, lane in ipairs(redis.call('SMEMBERS', bl)) do
      if not seen[lane] and #lanes < MAXLANES then
        lanes[#lanes + 1] = lane
        seen[lane] = true
        redis.call('SREM', bl, lane)
      end
    end
  end
  redis.call('SET', rk, '1\n' .. raw .. '\n' .. d, 'KEEPTTL')
  for _, lane in ipairs(lanes) do
    walk(S, lane, nil)
  end
  flush(S)
  return 1
end
