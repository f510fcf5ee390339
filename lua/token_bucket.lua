-- token_bucket.lua: one token bucket; lazy refill; a denial writes nothing.
-- KEYS[1]  hash {tokens, ts}
-- ARGV     capacity, refill, period_ms, cost (millitokens / ms), slack_ms
-- returns  {allowed, remaining, retry_after_ms, now_ms}; retry -1 = can never succeed
local capacity = lh_int(ARGV[1], 1, LH_MAX)
if not capacity then return lh_invalid('capacity') end
local refill = lh_int(ARGV[2], 1, LH_MAX)
if not refill then return lh_invalid('refill') end
local period = lh_int(ARGV[3], 1, LH_MAX)
if not period then return lh_invalid('period_ms') end
if capacity * period > LH_MAX_PRODUCT then return lh_invalid('capacity') end
local cost = lh_int(ARGV[4], 1, LH_MAX)
if not cost then return lh_invalid('cost') end
local slack = lh_int(ARGV[5], 0, LH_MAX)
if not slack then return lh_invalid('slack_ms') end

local now = lh_now_ms()
if cost > capacity then
  return {0, 0, -1, now}
end

local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(state[1]), tonumber(state[2])
if tokens == nil or ts == nil then
  tokens, ts = capacity, now
end
-- Clock back: no refill and ts never moves back. Far forward: at most a full bucket.
local full_ms = math.ceil(capacity * period / refill)
local elapsed = math.min(math.max(0, now - ts), full_ms)
tokens = math.min(capacity, tokens + math.floor(elapsed * refill / period))

if tokens >= cost then
  tokens = tokens - cost
  redis.call('HSET', KEYS[1], 'tokens', lh_str(tokens), 'ts', lh_str(math.max(ts, now)))
  redis.call('PEXPIRE', KEYS[1], full_ms + slack)
  return {1, tokens, 0, now}
end
return {0, tokens, math.ceil((cost - tokens) * period / refill), now}
