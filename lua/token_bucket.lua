-- token_bucket.lua: one token bucket; lazy refill; a denial writes nothing.
-- KEYS[1]  hash {tokens, ts}
-- ARGV     capacity, refill, period_ms, cost (millitokens / ms), slack_ms
-- returns  {allowed, remaining, retry_after_ms, now_ms}; retry -1 = can never succeed
local capacity, refill, period = lh_rate(ARGV, 1)
if not capacity then return lh_invalid(refill) end
local cost = lh_int(ARGV[4], 1, LH_MAX)
if not cost then return lh_invalid('cost') end
local slack = lh_int(ARGV[5], 0, LH_MAX)
if not slack then return lh_invalid('slack_ms') end

local now = lh_now_ms()
if cost > capacity then
  return {0, 0, -1, now}
end

local tokens, ts, full_ms = lh_bucket(KEYS[1], capacity, refill, period, now)

if tokens >= cost then
  tokens = tokens - cost
  redis.call('HSET', KEYS[1], 'tokens', lh_str(tokens), 'ts', lh_str(ts))
  redis.call('PEXPIRE', KEYS[1], full_ms + slack)
  return {1, tokens, 0, now}
end
return {0, tokens, math.ceil((cost - tokens) * period / refill), now}
