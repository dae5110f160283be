-- tidy.lua: shorten the life of a free flight lock's fence counter.
--
-- lock/redis deletes a free lock's key but keeps its last fence in
-- KEYS[1] .. ':f' for 7 days after the last acquisition. A dedup lock is per
-- request, though: kept that long, every distinct request would leave a key
-- behind for a week. Fences stay increasing without it (lock/redis mints
-- max(last + 1, server TIME in µs)); a short life still covers quick
-- successions of generations.
--
-- KEYS[1] the lock key (lock/redis's format): missing when the lock is free
--         and nobody is queued
-- ARGV[1] ms the fence counter may live on
--
-- Returns 1 if shortened, 0 if the lock is held, queued for, or has no counter.
local F = KEYS[1] .. ':f'
if redis.call('EXISTS', KEYS[1]) == 0 and redis.call('PTTL', F) > tonumber(ARGV[1]) then
  redis.call('PEXPIRE', F, ARGV[1])
  return 1
end
return 0
