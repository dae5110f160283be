-- admit.lua: one admission attempt (mode "a") or a waiter joining / renewing
-- its place in its lane (mode "q"); either way the lane is walked from the head.
--
-- KEYS[1] B, the key base "<prefix>{<group>}" (see lib.lua)
-- ARGV[1] mode "a" or "q"   ARGV[2] request id   ARGV[3] spec (binary, see lib.lua)
-- ARGV[4] priority          ARGV[5] waiter lease ms (mode "q")
--
-- Returns {1, decision} admitted, or {0, decision, hint_us} not (yet)
-- admitted: hint_us, when there, is how long a waiter should sleep before it
-- asks again (see sooner in lib.lua); without it, the decision's wait.
local B, mode, id, raw = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local S = new_state(B)
local f = parse_spec(raw, 1)
local lane = f[5]
local q = B .. ':q:' .. lane

-- One call finds the usual case: no reservation under this id and nobody
-- waiting in the lane.
local queued = false
if redis.call('EXISTS', B .. ':r:' .. id, q) > 0 then
  -- Admitted earlier by another caller's walk (the wake-up may still be in
  -- flight), or, in mode "a", asked again with the id of a held reservation?
  local st, prev = reservation(S, id)
  if st == '0' then
    redis.call('DEL', B .. ':n:' .. id)
    return {1, prev}
  end
  queued = redis.call('EXISTS', q) == 1
end

-- Fast path: nobody waits in this lane.
if not queued then
  local ok, wait, first = evaluate(S, f, nil)
  if ok then
    charge(S, f, id)
    local d = decision(S, f, true, wait, 0)
    reserve(S, id, raw, f, d)
    flush(S)
    return {1, d}
  end
  if mode == 'a' then
    local d = decision(S, f, false, wait, first)
    flush(S) -- what an expiry gave back (sweep_refunds), if anything
    return {0, d}
  end
end

local ql = B .. ':ql:' .. lane
local lease = 1000
if mode == 'q' then lease = tonumber(ARGV[5]) end
if not redis.call('ZSCORE', q, id) then
  local seq = redis.call('INCR', B .. ':seq')
  redis.call('ZADD', q, tonumber(ARGV[4]) * 1e13 + seq, id)
end
redis.call('SET', B .. ':w:' .. id, raw, 'PX', 2 * lease)
redis.call('ZADD', ql, S.now_ms + lease, id)
if redis.call('PTTL', q) < 2 * lease then
  redis.call('PEXPIRE', q, 2 * lease)
  redis.call('PEXPIRE', ql, 2 * lease)
end

local mine = walk(S, lane, id)
flush(S)
if mine and mine[1] then
  return {1, mine[2]}
end
if mode == 'a' then
  dequeue(S, lane, id)
end
if mine then
  return {0, mine[2], mine[3]}
end
-- Queued beyond the part of the lane a walk examines.
local _, _, first = evaluate(S, f, {})
return {0, decision(S, f, false, -1, first)}
