-- claim.lua: start generation ARGV[1] of a flight, unless a result is
-- retained or a generation at least as new is running.
--
-- KEYS[1] M, the flight record: a hash
--           g  the generation: its leader's fencing token (decimal)
--           s  'r' running | 'f' finished
--           f  the request fingerprint
--         The frames of generation G are the stream M .. ':' .. G, which
--         shares M's hash tag, so its Cluster slot.
-- ARGV[1] gen: the caller's fencing token; the caller holds the flight's lock
-- ARGV[2] fingerprint   ARGV[3] keep ms (life of a running generation's keys)
--
-- Returns {claimed, g, s, f}: the record after the call; claimed is 1 if the
-- caller now leads generation ARGV[1], 0 if nothing changed.
-- No time is read: every deadline is a relative PEXPIRE.
local M, gen = KEYS[1], ARGV[1]

-- a < b for canonical decimal strings of any length.
local function older(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

local cur = redis.call('HMGET', M, 'g', 's', 'f')
if cur[1] and (cur[2] == 'r' or cur[2] == 'f') then
  if cur[2] == 'f' or not older(cur[1], gen) then
    return {0, cur[1], cur[2], cur[3] or ''}
  end
  -- A running generation older than ours: its leader lost the lock, which
  -- the caller holds now. End it: its readers find a lone abort entry.
  local S = M .. ':' .. cur[1]
  redis.call('XADD', S, 'MAXLEN', '1', '*', 'a', '')
  redis.call('PEXPIRE', S, ARGV[3])
end
redis.call('DEL', M)
redis.call('HSET', M, 'g', gen, 's', 'r', 'f', ARGV[2])
redis.call('PEXPIRE', M, ARGV[3])
return {1, gen, 'r', ARGV[2]}
