-- gcra.lua: the token bucket as a meter on one timestamp, the theoretical
-- arrival time (TAT). A denial writes nothing.
-- KEYS[1]  hash {tat}
-- ARGV     capacity, refill, period_ms, cost (millitokens / ms), slack_ms
-- returns  {allowed, remaining, retry_after_ms, now_ms}; retry -1 = can never succeed
local capacity, refill, period = lh_rate(ARGV, 1)
if not capacity then return lh_invalid(refill) end
local cost = lh_int(ARGV[4], 1, LH_MAX)
if not cost then return lh_invalid('cost') end
local slack = lh_int(ARGV[5], 0, LH_MAX)
if not slack then return lh_invalid('slack_ms') end
if #KEYS ~= 1 then return lh_invalid('key') end

local now = lh_now_ms()
if cost > capacity then
  return {0, 0, -1, now}
end

local inc = math.ceil(cost * period / refill)         -- emission interval x cost
local burst = math.ceil(capacity * period / refill)   -- full refill time
local tat = tonumber(redis.call('HGET', KEYS[1], 'tat'))
if tat == nil then tat = now end
-- Clock back: tat never moves back (start >= tat). Far forward: start = now, a full bucket.
local start = math.max(tat, now)
local level = start + inc - now

local function remaining(at)
  return math.min(capacity, math.max(0, math.floor((burst - (at - now)) * refill / period)))
end

if level <= burst then
  local new_tat = start + inc
  redis.call('HSET', KEYS[1], 'tat', lh_str(new_tat))
  redis.call('PEXPIRE', KEYS[1], new_tat - now + slack)
  return {1, remaining(new_tat), 0, now}
end
return {0, remaining(start), level - burst, now}
