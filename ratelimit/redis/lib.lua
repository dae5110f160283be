-- lib.lua: functions shared by the limiter's scripts; prepended to each.
--
-- Every key lives under B = KEYS[1] = "<prefix>{<group>}", one Cluster slot:
--   B:s                hash  shared state, read and written in one call per decision:
--                            b:<scope>:<r|t>:<window_us> -> rate bucket: level and updated_us,
--                              two little-endian doubles (struct '<dd', 16 bytes); while a
--                              limit learned from the provider is in force (learn.lua), also
--                              that limit and when it ends (µs): '<dddd', 32 bytes
--                            cd:<scope> -> cooldown end (µs, decimal)
--                            x -> the earliest expiry in B:x, or earlier (ms, decimal); absent
--                              when B:x is empty. Read with the buckets, it costs the usual
--                              decision nothing to learn that no refund is due
--                      A bucket's stored level only matters until it has refilled; a stale
--                      field reads as a full bucket. Fields number one per configured limit.
--   B:c:<scope>        zset  concurrency permits: member = reservation id, score = expiry (ms)
--   B:q:<lane>         zset  waiters: member = request id, score = priority * 1e13 + arrival seq
--   B:ql:<lane>        zset  waiters' leases: member = request id, score = expiry (ms)
--   B:w:<id>           string a queued request's spec
--   B:e:<id>           string the same, as JSON, from a version before the binary spec: read
--                            and deleted, never written (it expires within its lease)
--   B:r:<id>           string reservation: "h<spec><decision>" held (the spec says where it
--                            ends), "u<spec><decision>" held with its usage so far in B:u,
--                            "s" settled
--   B:x                zset  reservations with their usage so far recorded (extend.lua):
--                            member = id, score = expiry (ms), as its B:r
--   B:u                hash  id -> its spec, then per charge the usage recorded (doubles): what
--                            its rate charges are settled at if it expires (sweep_refunds)
--   B:n:<id>           list  wake-up of a waiter: its decision is pushed here
--   B:bl:<scope>       set   lanes whose waiters are blocked on scope
--   B:h:<lane>         hash  waiter id -> when it was last told it would fit (µs)
--   B:seq              string arrival sequence
-- A spec is binary, written by encodeSpec (redis.go) and read with struct.unpack, all
-- little-endian: "S", n (uint16), hold_ms, defer_us (doubles), lane (uint32 length, bytes),
-- then per charge: kind (1 byte: "r" requests, "t" tokens, "c" concurrency), scope, field
-- and cooldown field (each uint32 length, bytes), limit, window_us, burst, cost (doubles).
-- field names the limit: "b:<scope>:<kind>:<window_us>" (its bucket in B:s) or
-- "c:<scope>"; the cooldown field is "cd:<scope>". Lengths let a scope or lane hold any
-- bytes; doubles hold every amount up to 2^53 exactly. defer_us is how far ahead of its
-- tokens the request may be admitted (it is then told to start later).
-- Parsed (parse_spec), a spec is a flat array f: f[2] n, f[3] hold_ms, f[4] defer_us, f[5]
-- lane, and charge i at k = 8 * i - 3: f[k+1] kind, f[k+2] scope, f[k+3] field, f[k+4]
-- cooldown field, f[k+5] limit, f[k+6] window_us, f[k+7] burst, f[k+8] cost.
-- A decision is the string "a w d r1 s1 r2 s2 ..." of integers: admitted (1|0),
-- wait_us (when refused: -1 unknown; when admitted: how long to hold off before
-- starting, for a deferred admission), index of the first refusing charge (0 none), then per
-- charge remaining and reset_ms. A wake-up list carries the waiter's decision when it is
-- admitted, or a hint "0 wait_us d" when it became the first in its lane that cannot go yet.
-- Learned limits: a bucket with a learned limit L in force gives every charge on it the rate
-- min(limit, L) / window and the burst min(burst, L); a charge costing more than that burst
-- waits for a full bucket. The next write after L ends drops it (16 bytes again).
-- Upgrade: reservations ("state\n<JSON spec>\ndecision") and queued entries (B:e) written by
-- the versions before the binary spec, and their "level updated_us" bucket fields, are still
-- read (reservation, spec_of, new_bucket); the entries expire within their hold or lease.
-- While both run, an older version reads the new bucket fields (and the 32-byte ones of
-- learned limits) as full buckets, drops a learned limit when it writes a bucket, does not know
-- the new reservations (its Settle says unknown; they expire within their hold) and drops the
-- new waiters it meets from its lane walks (they queue again when they renew).
-- A version before recorded usage takes a "u" reservation for an unknown one (its Settle
-- says so); the reservation is settled at its recorded usage by the first script of a
-- version that knows, once it expired.
-- Time comes from the server only.
local MAXSCAN = 64  -- waiters examined per walk of a lane
local MAXLANES = 32 -- lanes walked after a settle (the rest keep their mark for the next)
local MAXSWEEP = 64 -- expired reservations settled at their usage per script (the rest, by the next)
-- Written out for specs and decisions of 1 to 4 charges, so that one call
-- reads or prints all of it; longer ones go a charge at a time.
local SPEC_HEAD, SPEC_CHARGE = '<c1HddI4c0', '<c1I4c0I4c0I4c0dddd'
local SPEC_FORMAT = {
  '<c1HddI4c0c1I4c0I4c0I4c0dddd',
  '<c1HddI4c0c1I4c0I4c0I4c0ddddc1I4c0I4c0I4c0dddd',
  '<c1HddI4c0c1I4c0I4c0I4c0ddddc1I4c0I4c0I4c0ddddc1I4c0I4c0I4c0dddd',
  '<c1HddI4c0c1I4c0I4c0I4c0ddddc1I4c0I4c0I4c0ddddc1I4c0I4c0I4c0ddddc1I4c0I4c0I4c0dddd',
}
local DECISION_FORMAT = {'%d %d %d %d %d', '%d %d %d %d %d %d %d', '%d %d %d %d %d %d %d %d %d', '%d %d %d %d %d %d %d %d %d %d %d'}

local function new_state(B)
  local t = redis.call('TIME')
  local us = t[1] * 1000000 + t[2]
  return {B = B, now_us = us, now_ms = (us - us % 1000) / 1000,
          buckets = {}, dirty = {}, permits = {}, held = {}, cooldowns = {}}
end

-- parse_spec reads the binary spec that starts at pos of s (see above) into
-- the array f, and sets f[6 + 8 * n] to the position after it.
local function parse_spec(s, pos)
  local lo, hi = string.byte(s, pos + 1, pos + 2)
  local n = lo + 256 * hi
  local fmt = SPEC_FORMAT[n]
  local f
  if fmt then
    f = {struct.unpack(fmt, s, pos)}
  else -- a charge at a time: one call's results are bounded by the Lua stack
    f = {}
    f[1], f[2], f[3], f[4], f[5], pos = struct.unpack(SPEC_HEAD, s, pos)
    for i = 1, n do
      local k = 8 * i - 3
      f[k + 1], f[k + 2], f[k + 3], f[k + 4], f[k + 5], f[k + 6], f[k + 7], f[k + 8], pos =
        struct.unpack(SPEC_CHARGE, s, pos)
    end
    f[6 + 8 * n] = pos
  end
  if f[1] ~= 'S' then error('ratelimit: malformed spec') end
  return f
end

-- spec_of reads a queued entry's spec: binary, or JSON, written before it:
-- {"c": [[kind, scope, limit, window_us, burst, cost], ...], "h": hold_ms, "l": lane, "x": defer_us}.
-- A JSON spec has f.json set.
local function spec_of(s)
  if string.byte(s, 1) ~= 123 then return parse_spec(s, 1) end
  local j = cjson.decode(s)
  local f = {'S', #j.c, j.h, j.x or 0, j.l, json = true}
  for i, c in ipairs(j.c) do
    local k = 8 * i - 3
    f[k + 1], f[k + 2], f[k + 5], f[k + 6], f[k + 7], f[k + 8] = c[1], c[2], c[3], c[4], c[5], c[6]
    if c[1] == 'c' then
      f[k + 3] = 'c:' .. c[2]
    else
      f[k + 3] = 'b:' .. c[2] .. ':' .. c[1] .. ':' .. string.format('%d', c[4])
    end
    f[k + 4] = 'cd:' .. c[2]
  end
  return f
end

-- learned_params returns the rate and burst of charge k of f under a learned limit ll.
local function learned_params(f, k, ll)
  local limit, burst = f[k + 5], f[k + 7]
  if ll < limit then limit = ll end
  if ll < burst then burst = ll end
  return limit / f[k + 6], burst
end

-- new_bucket makes the bucket of charge k of f from its stored value v.
local function new_bucket(S, f, k, v)
  local rate = f[k + 5] / f[k + 6] -- units per µs
  local burst = f[k + 7]
  local level = burst
  local ll, lu = nil, nil -- learned limit in force, and its end
  if v then
    local l, t
    local n = #v
    if n == 16 then
      l, t = struct.unpack('<dd', v)
    elseif n == 32 then -- with a learned limit
      local a, e
      l, t, a, e = struct.unpack('<dddd', v)
      local lrate, lburst = learned_params(f, k, a)
      if e > S.now_us then
        ll, lu, rate, burst = a, e, lrate, lburst
      elseif e > t then
        -- It ended since: its rate up to its end, the charge's own after.
        l = l + (e - t) * lrate
        if l > lburst then l = lburst end
        t = e
      end
    else -- "level updated_us", written before the binary levels
      l, t = string.match(v, '^(%S+) (%d+)$')
      l, t = tonumber(l), tonumber(t)
    end
    if l and t then
      level = l + (S.now_us - t) * rate
      if level > burst then level = burst end
    end
  end
  local b = {key = f[k + 3], level = level, rate = rate, burst = burst, dirty = false, learned = ll, learned_until = lu}
  S.buckets[b.key] = b
  return b
end

-- touch marks bucket b for flush.
local function touch(S, b)
  if not b.dirty then
    b.dirty = true
    S.dirty[#S.dirty + 1] = b
  end
end

-- blocked_lanes adds to lanes (seen: the set of them) the lanes whose
-- waiters are blocked on scope, up to MAXLANES in all, and forgets them as
-- blocked: the walk that follows marks them again if they still are.
local function blocked_lanes(S, scope, lanes, seen)
  local bl = S.B .. ':bl:' .. scope
  for _, l in ipairs(redis.call('SMEMBERS', bl)) do
    if not seen[l] and #lanes < MAXLANES then
      lanes[#lanes + 1] = l
      seen[l] = true
      redis.call('SREM', bl, l)
    end
  end
end

-- sweep_refunds settles the rate charges of the reservations in B:x whose
-- hold is over (at most MAXSWEEP) at the usage they recorded, as settle
-- would: the buckets get back what was reserved beyond it (never above
-- their burst), and the lanes that may now have room are noted in S.wake
-- (flush walks them). Every script that reads buckets runs it before using
-- them (prefetch, refund_due), so no refund lands after something that
-- followed the expiry; a refill in between commutes with it. A reservation
-- whose B:r the server has not dropped yet (its clock and TIME may differ
-- by a millisecond) is dropped here: it expired by TIME, as its permits did.
-- Afterwards S.due and the field x say when the next one expires.
local function sweep_refunds(S)
  local xk, uk = S.B .. ':x', S.B .. ':u'
  local ids = redis.call('ZRANGEBYSCORE', xk, '-inf', S.now_ms, 'LIMIT', 0, MAXSWEEP)
  if #ids > 0 then
    local recs = redis.call('HMGET', uk, unpack(ids))
    local lanes, seen, scopes = S.wake or {}, {}, {}
    for _, l in ipairs(lanes) do seen[l] = true end
    S.swept = S.swept or {}
    for j = 1, #ids do
      local id, rec = ids[j], recs[j]
      local rk = S.B .. ':r:' .. id
      local v = redis.call('GET', rk)
      if rec and (not v or string.byte(v, 1) == 117) then -- gone, or still "u...": not settled
        if v then redis.call('DEL', rk) end
        S.swept[id] = true
        local f = parse_spec(rec, 1)
        local pos = f[6 + 8 * f[2]]
        for i = 1, f[2] do
          local k = 8 * i - 3
          if f[k + 1] ~= 'c' then
            local used = struct.unpack('<d', rec, pos + 8 * (i - 1))
            local b = S.buckets[f[k + 3]] or new_bucket(S, f, k, redis.call('HGET', S.B .. ':s', f[k + 3]))
            b.level = b.level - (used - f[k + 8])
            if b.level > b.burst then b.level = b.burst end
            touch(S, b)
            if not scopes[f[k + 2]] then
              scopes[f[k + 2]] = true
              blocked_lanes(S, f[k + 2], lanes, seen)
            end
          end
        end
        if not seen[f[5]] and #lanes < MAXLANES then
          lanes[#lanes + 1] = f[5]
          seen[f[5]] = true
        end
      end
    end
    redis.call('ZREM', xk, unpack(ids))
    redis.call('HDEL', uk, unpack(ids))
    if #lanes > 0 then S.wake = lanes end
  end
  local first = redis.call('ZRANGE', xk, 0, 0, 'WITHSCORES')
  if first[2] then
    S.due = tonumber(first[2])
    redis.call('HSET', S.B .. ':s', 'x', first[2])
  else
    S.due = nil
    redis.call('HDEL', S.B .. ':s', 'x')
  end
end

-- refund_due runs sweep_refunds if a reservation with recorded usage has
-- expired, for the scripts that read buckets without prefetch.
local function refund_due(S)
  if S.due_read then return end
  S.due_read = true
  S.due = tonumber(redis.call('HGET', S.B .. ':s', 'x'))
  if S.due and S.due <= S.now_ms then sweep_refunds(S) end
end

-- sooner shortens wait_us, how long a waiter is told to sleep, to when the
-- next reservation with recorded usage expires, if that is sooner: the
-- expiry may give back what the waiter needs.
local function sooner(S, wait)
  local due = S.due
  if due and wait > 0 then
    local d = (due - S.now_ms) * 1000
    if d > 0 and d < wait then return d end
  end
  return wait
end

-- prefetch reads, in one call, every bucket and cooldown of f that this run
-- has not read yet; the first call also reads when the next reservation
-- with recorded usage expires, and settles those that did (sweep_refunds).
local function prefetch(S, f)
  local buckets, cds = S.buckets, S.cooldowns
  local fields, want, m = {}, {}, 0
  if not S.due_read then
    m = 1
    fields[1], want.x = 'x', -1
  end
  for i = 1, f[2] do
    local k = 8 * i - 3
    if f[k + 1] ~= 'c' then
      local key = f[k + 3]
      if not buckets[key] and not want[key] then
        m = m + 1
        fields[m], want[key] = key, k
      end
    end
    local cd = f[k + 4]
    if not cds[cd] and not want[cd] then
      m = m + 1
      fields[m], want[cd] = cd, 0
    end
  end
  if m == 0 then return end
  local vals = redis.call('HMGET', S.B .. ':s', unpack(fields))
  for i = 1, m do
    local key, v = fields[i], vals[i]
    local k = want[key]
    if k == -1 then
      S.due_read, S.due = true, tonumber(v)
    elseif k ~= 0 then
      new_bucket(S, f, k, v)
    elseif v then
      cds[key] = tonumber(v)
    else
      cds[key] = 0
    end
  end
  if S.due and S.due <= S.now_ms and not S.swept then sweep_refunds(S) end
end

local function bucket(S, f, k)
  local b = S.buckets[f[k + 3]]
  if b then return b end
  return new_bucket(S, f, k, redis.call('HGET', S.B .. ':s', f[k + 3]))
end

local function permits(S, f, k)
  local key = S.B .. ':c:' .. f[k + 2]
  local p = S.permits[key]
  if p then return p end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', S.now_ms)
  p = {key = key, count = redis.call('ZCARD', key), limit = f[k + 5], hold = 0, free_at = nil}
  S.permits[key] = p
  return p
end

-- evaluate reports whether f fits now. blocked (or nil) holds the fields of
-- limits that waiters ahead are stuck on; they refuse too, so nobody jumps the
-- queue on a limit. Returns ok, wait_us (-1 = unknown), first refusing index,
-- and the offsets k of the refusing charges (nil when ok).
local function evaluate(S, f, blocked)
  prefetch(S, f)
  local buckets, cds, now_us = S.buckets, S.cooldowns, S.now_us
  local ok, wait, first, refused = true, 0, 0, nil
  local deferable = true -- refused only for tokens not there yet
  for i = 1, f[2] do
    local k = 8 * i - 3
    local w = nil
    local cd = cds[f[k + 4]] -- read by prefetch
    if cd > now_us then w, deferable = cd - now_us, false end
    if blocked and blocked[f[k + 3]] then w, deferable = -1, false end
    if f[k + 1] == 'c' then
      local p = permits(S, f, k)
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
      local b = buckets[f[k + 3]] -- read by prefetch
      local cost = f[k + 8]
      if cost > b.burst then cost = b.burst end -- under a learned limit: wait for a full bucket
      if b.level < cost then
        local need = (cost - b.level) / b.rate
        if w == nil or (w >= 0 and need > w) then w = need end
      end
    end
    if w ~= nil then
      ok = false
      if first == 0 then first = i end
      if refused then refused[#refused + 1] = k else refused = {k} end
      if w < 0 or wait < 0 then wait = -1 elseif w > wait then wait = w end
    end
  end
  if ok then return true, 0, 0, nil end
  if deferable and wait >= 0 and wait <= f[4] then
    -- Admit now, to start when the tokens exist: the bucket goes below
    -- zero by what it lends, so the schedule stays exact and wake-up
    -- latency costs no capacity.
    return true, math.ceil(wait), 0, nil
  end
  return false, math.ceil(wait), first, refused
end

-- charge takes f's costs; evaluate(S, f) has read its buckets.
local function charge(S, f, id)
  local hold = f[3]
  for i = 1, f[2] do
    local k = 8 * i - 3
    if f[k + 1] == 'c' then
      local p = permits(S, f, k)
      redis.call('ZADD', p.key, S.now_ms + hold, id)
      p.count = p.count + 1
      if p.hold == 0 then S.held[#S.held + 1] = p end
      if hold > p.hold then p.hold = hold end
    else
      local b = S.buckets[f[k + 3]]
      b.level = b.level - f[k + 8]
      touch(S, b)
    end
  end
end

-- decision prints the decision on f (see above). Remaining is floor(level)
-- and reset ceil((burst - level) / rate / 1000), both at least 0, written
-- as arithmetic (x - x % 1 is floor(x), exactly): calls cost more here.
local function decision(S, f, ok, wait, first)
  local n = f[2]
  local o = {0, wait, first}
  if ok then o[1] = 1 end
  for i = 1, n do
    local k = 8 * i - 3
    local rem, reset = 0, 0
    if f[k + 1] == 'c' then
      local p = permits(S, f, k)
      rem = p.limit - p.count
    else
      local b = bucket(S, f, k)
      local l = b.level
      local y = (l - b.burst) / b.rate / 1000 -- -reset, unrounded
      rem, reset = l - l % 1, y % 1 - y      -- floor(l), ceil(-y)
    end
    if rem < 0 then rem = 0 end
    if reset < 0 then reset = 0 end
    o[2 + 2 * i], o[3 + 2 * i] = rem, reset
  end
  local fmt = DECISION_FORMAT[n]
  if fmt then
    return string.format(fmt, o[1], o[2], o[3], o[4], o[5], o[6], o[7], o[8], o[9], o[10], o[11])
  end
  local out = {}
  for i = 1, #o do out[i] = string.format('%d', o[i]) end
  return table.concat(out, ' ')
end

local wake -- defined after walk

-- flush walks the lanes an expiry refund may have made room in (wake),
-- then writes back, in one call, the buckets this run changed.
local function flush(S)
  if S.wake then wake(S) end
  local dirty = S.dirty
  if #dirty > 0 then
    local args = {}
    for i = 1, #dirty do
      local b = dirty[i]
      if b.learned then
        args[2 * i - 1], args[2 * i] = b.key, struct.pack('<dddd', b.level, S.now_us, b.learned, b.learned_until)
      else
        args[2 * i - 1], args[2 * i] = b.key, struct.pack('<dd', b.level, S.now_us)
      end
      b.dirty = false
    end
    S.dirty = {}
    redis.call('HSET', S.B .. ':s', unpack(args))
  end
  for i = 1, #S.held do
    local p = S.held[i]
    if redis.call('PTTL', p.key) < p.hold + 1000 then
      redis.call('PEXPIRE', p.key, p.hold + 1000)
    end
  end
  S.held = {}
end

-- reserve records the admission of raw (f, parsed) with decision d.
local function reserve(S, id, raw, f, d)
  if f.json then -- a waiter queued before the binary spec: the format of then
    redis.call('SET', S.B .. ':r:' .. id, '0\n' .. raw .. '\n' .. d, 'PX', f[3])
  else
    redis.call('SET', S.B .. ':r:' .. id, 'h' .. raw .. d, 'PX', f[3])
  end
end

-- reservation returns the state of reservation id ('0' held, '1' settled,
-- nil unknown), and when held its decision and spec, whether its usage is
-- recorded in B:u, and its stored value.
local function reservation(S, id)
  local v = redis.call('GET', S.B .. ':r:' .. id)
  if not v then return nil end
  local c = string.byte(v, 1)
  if c == 104 or c == 117 then -- "h<spec><decision>", "u<spec><decision>"
    local f = parse_spec(v, 2)
    return '0', string.sub(v, f[6 + 8 * f[2]]), f, c == 117, v
  end
  if c == 115 then return '1' end -- "s"
  -- "state\nspec\ndecision", written before the binary spec.
  local st, raw, d = string.match(v, '^(%d)\n(.*)\n([^\n]*)$')
  if st == '0' then return st, d, spec_of(raw) end
  return st, d
end

local function dequeue(S, lane, id)
  redis.call('ZREM', S.B .. ':q:' .. lane, id)
  redis.call('ZREM', S.B .. ':ql:' .. lane, id)
  redis.call('HDEL', S.B .. ':h:' .. lane, id)
  redis.call('DEL', S.B .. ':w:' .. id, S.B .. ':e:' .. id)
end

-- hint tells the first waiter of a lane that cannot go yet when it will fit,
-- so it sleeps exactly that long; it is told again only if that time moves.
local function hint(S, lane, id, f, wait, first)
  local hk = S.B .. ':h:' .. lane
  local target = S.now_us + wait
  local prev = tonumber(redis.call('HGET', hk, id) or '0')
  if math.abs(prev - target) <= 1000 then return end
  redis.call('HSET', hk, id, string.format('%d', target))
  redis.call('PEXPIRE', hk, 60000)
  local nk = S.B .. ':n:' .. id
  redis.call('RPUSH', nk, string.format('0 %d %d', wait, first))
  redis.call('PEXPIRE', nk, f[3])
end

-- walk admits, in order, every waiter of lane that fits, and wakes each on
-- its own list (except self, whose result is returned instead:
-- {admitted, decision, hint_us} or nil if self was not examined; hint_us is
-- how long self should sleep, sooner than the decision's wait when a
-- reservation with recorded usage expires first).
local function walk(S, lane, self)
  local q, ql = S.B .. ':q:' .. lane, S.B .. ':ql:' .. lane
  if S.wake then S.walked = S.walked or {}; S.walked[lane] = true end
  local ids = redis.call('ZRANGE', q, 0, MAXSCAN - 1)
  local blocked, mine, headed = {}, nil, false
  for _, id in ipairs(ids) do
    local raw = redis.call('GET', S.B .. ':w:' .. id)
    if not raw then raw = redis.call('GET', S.B .. ':e:' .. id) end -- queued before the binary spec
    if not raw or tonumber(redis.call('ZSCORE', ql, id) or '0') <= S.now_ms then
      dequeue(S, lane, id) -- a waiter that died (or gave up) while queued
    else
      local f = spec_of(raw)
      local ok, wait, first, refused = evaluate(S, f, blocked)
      if ok then
        charge(S, f, id)
        local d = decision(S, f, true, wait, 0)
        dequeue(S, lane, id)
        reserve(S, id, raw, f, d)
        if id == self then
          mine = {true, d, 0}
        else
          local nk = S.B .. ':n:' .. id
          redis.call('RPUSH', nk, d)
          redis.call('PEXPIRE', nk, f[3])
        end
      else
        for _, k in ipairs(refused) do
          blocked[f[k + 3]] = true
          local bl = S.B .. ':bl:' .. f[k + 2]
          redis.call('SADD', bl, lane)
          redis.call('PEXPIRE', bl, 60000)
        end
        if id == self then
          mine = {false, decision(S, f, false, wait, first), sooner(S, wait)}
        elseif not headed and wait > 0 then
          hint(S, lane, id, f, sooner(S, wait), first)
        end
        headed = true
      end
    end
  end
  return mine
end

-- settle applies the real costs (actual = nil refunds everything; else
-- actual[i], a decimal string, replaces charge i's cost), frees permits and
-- then walks the lanes that may now have room: its own and those blocked on
-- its scopes.
-- Returns 0 unknown reservation, 1 settled, 2 already settled.
local function settle(S, id, actual)
  local st, _, f, recorded = reservation(S, id)
  if not st then return 0 end
  if st == '1' then return 2 end
  prefetch(S, f)
  if S.swept and S.swept[id] then -- expired by TIME, settled at its usage just now
    flush(S)
    return 0
  end
  if recorded then
    redis.call('ZREM', S.B .. ':x', id)
    redis.call('HDEL', S.B .. ':u', id)
  end
  local marks, scanned = {}, {} -- B:bl:<scope>, once per scope
  for i = 1, f[2] do
    local k = 8 * i - 3
    local scope = f[k + 2]
    if f[k + 1] == 'c' then
      redis.call('ZREM', S.B .. ':c:' .. scope, id)
      S.permits[S.B .. ':c:' .. scope] = nil
    else
      local cost = f[k + 8]
      local a = 0
      if actual then a = tonumber(actual[i] or cost) end
      local b = S.buckets[f[k + 3]] -- read by prefetch
      b.level = b.level - (a - cost)
      if b.level > b.burst then b.level = b.burst end
      touch(S, b)
    end
    if not scanned[scope] then
      scanned[scope] = true
      marks[#marks + 1] = S.B .. ':bl:' .. scope
    end
  end
  redis.call('SET', S.B .. ':r:' .. id, 's', 'KEEPTTL')
  -- One call finds the usual case: nobody waits in the lane and no lane is
  -- blocked on these scopes, so there is nothing to walk.
  local lane = f[5]
  if redis.call('EXISTS', S.B .. ':q:' .. lane, unpack(marks)) > 0 then
    local lanes, seen = {lane}, {[lane] = true}
    for j = 1, #marks do
      for _, l in ipairs(redis.call('SMEMBERS', marks[j])) do
        if not seen[l] and #lanes < MAXLANES then
          lanes[#lanes + 1] = l
          seen[l] = true
          redis.call('SREM', marks[j], l)
        end
      end
    end
    for i = 1, #lanes do
      walk(S, lanes[i], nil)
    end
  end
  flush(S)
  return 1
end

-- wake walks the lanes noted by sweep_refunds, except those this run
-- walked after it (they saw the refunds).
wake = function(S)
  local lanes, walked = S.wake, S.walked or {}
  S.wake = nil
  for i = 1, #lanes do
    if not walked[lanes[i]] then walk(S, lanes[i], nil) end
  end
end
