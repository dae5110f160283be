-- fence.lua: prepended to acquire.lua, release.lua and extend.lua.
--
-- KEYS[1] .. ':f' keeps the last fencing token minted for the lock KEYS[1];
-- it lives 7 days after the last acquisition.

-- time_us is the server's clock in µs.
local function time_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- next_fence mints max(last + 1, now_us): strictly increasing per lock, and
-- never below the server's clock, so a Redis that lost the counter (a
-- restart without persistence, a failover to a replica that lagged) still
-- mints fences above every earlier one.
local function next_fence(L, now_us)
  local F = L .. ':f'
  local last = tonumber(redis.call('SET', F, string.format('%d', now_us), 'PX', '604800000', 'GET') or '0') or 0
  if last < now_us then
    return now_us
  end
  -- The clock is behind the last fence (it stepped back): count on from it.
  redis.call('SET', F, string.format('%d', last + 1), 'PX', '604800000')
  return last + 1
end
