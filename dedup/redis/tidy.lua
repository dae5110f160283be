-- tidy.lua: shorten the life of a free flight lock.
--
-- lock/redis keeps a lock's key for 7 days after release, so that the next
-- fence is always last + 1. A dedup lock is per request, though: kept that
-- long, every distinct request would leave a key behind for a week. Fences
-- stay increasing without it (lock/redis takes max(last + 1, server TIME in
-- µs)); a short life still covers quick successions of generations.
--
-- KEYS[1] the lock key, in lock/redis's documented format: a free lock with
--         no queued waiters is "-:0:0:<fence>:0:0"
-- ARGV[1] ms the free lock may live on
--
-- Returns 1 if shortened, 0 if the lock is held, queued for, or missing.
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 6) == '-:0:0:' and redis.call('PTTL', KEYS[1]) > tonumber(ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return 1
end
return 0
