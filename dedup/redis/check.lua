-- check.lua: what a follower reads when its blocking read timed out: any
-- entries after its cursor (appended since) and the state of its generation.
--
-- KEYS[1] M, the flight record (see claim.lua)   KEYS[2] S = M .. ':' .. gen
-- ARGV[1] gen   ARGV[2] cursor: the last entry ID read ("0-0" at the start)
-- ARGV[3] count: the most entries to return
--
-- Returns {state, entries}: state 1 running, 2 finished, 0 the record names
-- another generation or none; entries as XRANGE returns them.
local cur = redis.call('HMGET', KEYS[1], 'g', 's')
local entries = redis.call('XRANGE', KEYS[2], '(' .. ARGV[2], '+', 'COUNT', ARGV[3])
local state = 0
if cur[1] == ARGV[1] then
  if cur[2] == 'r' then
    state = 1
  elseif cur[2] == 'f' then
    state = 2
  end
end
return {state, entries}
