-- gcra.lua: the reference single-limit limiter the benchmark compares
-- against: GCRA as go-redis/redis_rate v10 implements it (its allowN
-- script, rewritten here because redis_rate is not a dependency): one key
-- holding the theoretical arrival time (TAT), time from Redis TIME.
--
-- KEYS[1] the limit's key
-- ARGV[1] burst   ARGV[2] rate (requests per period)   ARGV[3] period (s)   ARGV[4] cost
--
-- Returns {allowed, remaining, retry_after (s, string), reset_after (s, string)}.
local rate_limit_key = KEYS[1]
local burst = ARGV[1]
local rate = ARGV[2]
local period = ARGV[3]
local cost = tonumber(ARGV[4])

local emission_interval = period / rate
local increment = emission_interval * cost
local burst_offset = emission_interval * burst

-- Seconds since 2017-01-01, as redis_rate does, to keep the float exact to µs.
local jan_1_2017 = 1483228800
local now = redis.call("TIME")
now = (now[1] - jan_1_2017) + (now[2] / 1000000)

local tat = redis.call("GET", rate_limit_key)
if not tat then
  tat = now
else
  tat = tonumber(tat)
end
tat = math.max(tat, now)

local new_tat = tat + increment
local allow_at = new_tat - burst_offset
local diff = now - allow_at
local remaining = diff / emission_interval

if remaining < 0 then
  local reset_after = tat - now
  local retry_after = diff * -1
  return {0, 0, tostring(retry_after), tostring(reset_after)}
end

local reset_after = new_tat - now
if reset_after > 0 then
  redis.call("SET", rate_limit_key, new_tat, "EX", math.ceil(reset_after))
end
return {cost, remaining, tostring(-1), tostring(reset_after)}
