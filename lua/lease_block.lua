-- lease_block.lua: grant a gateway a whole block of B millitokens from one
-- token bucket, or nothing; never a partial block. A denial writes nothing.
-- KEYS[1]  hash {tokens, ts}
-- ARGV     capacity, refill, period_ms, block (B millitokens), gateways (N), slack_ms
-- returns  {granted, remaining, denied_until_ms, now_ms}
--          granted = B or 0; denied_until_ms = 0 when granted,
--          now + min(N x ceil(B x period / refill), 2^40) when not, -1 when B > capacity (never)
local capacity = lh_int(ARGV[1], 1, LH_MAX)
if not capacity then return lh_invalid('capacity') end
local refill = lh_int(ARGV[2], 1, LH_MAX)
if not refill then return lh_invalid('refill') end
local period = lh_int(ARGV[3], 1, LH_MAX)
if not period then return lh_invalid('period_ms') end
if capacity * period > LH_MAX_PRODUCT then return lh_invalid('capacity') end
local block = lh_int(ARGV[4], 1, LH_MAX)
if not block then return lh_invalid('block') end
local gateways = lh_int(ARGV[5], 1, 1024)
if not gateways then return lh_invalid('gateways') end
local slack = lh_int(ARGV[6], 0, LH_MAX)
if not slack then return lh_invalid('slack_ms') end
if #KEYS ~= 1 then return lh_invalid('key') end

local now = lh_now_ms()
if block > capacity then
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

if tokens >= block then
  tokens = tokens - block
  redis.call('HSET', KEYS[1], 'tokens', lh_str(tokens), 'ts', lh_str(math.max(ts, now)))
  redis.call('PEXPIRE', KEYS[1], full_ms + slack)
  return {block, tokens, 0, now}
end
-- N gateways each waiting for a block: exact while below 2^40 (the product
-- may round above 2^53, but then it is far above the cap and min() is exact).
local wait = math.min(gateways * math.ceil(block * period / refill), LH_MAX)
return {0, tokens, now + wait, now}
