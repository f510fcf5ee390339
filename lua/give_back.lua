-- give_back.lua: return a lease's unused millitokens to its token bucket,
-- never above capacity; idempotent per lease id through a record key.
-- KEYS[1]  bucket hash {tokens, ts}
-- KEYS[2]  give-back record for the lease id (same hash tag), string = added amount
-- ARGV     capacity, refill, period_ms, tokens (millitokens to return), slack_ms, record_ttl_ms
-- returns  {added, tokens_after, replayed, now_ms}
--          replayed = 1: the record existed, nothing written, added = 0
local capacity, refill, period = lh_rate(1)
if not capacity then return lh_invalid(refill) end
local give = lh_int(ARGV[4], 0, LH_MAX)
if not give then return lh_invalid('tokens') end
local slack = lh_int(ARGV[5], 0, LH_MAX)
if not slack then return lh_invalid('slack_ms') end
local record_ttl = lh_int(ARGV[6], 1, LH_MAX)
if not record_ttl then return lh_invalid('record_ttl_ms') end
if #KEYS ~= 2 or KEYS[1] == KEYS[2] then return lh_invalid('keys') end

local now = lh_now_ms()
local replayed = redis.call('EXISTS', KEYS[2]) == 1

local tokens, ts, full_ms = lh_bucket(KEYS[1], capacity, refill, period, now)

if replayed then
  return {0, tokens, 1, now}
end
local added = math.min(give, capacity - tokens)
tokens = tokens + added
redis.call('HSET', KEYS[1], 'tokens', lh_str(tokens), 'ts', lh_str(ts))
redis.call('PEXPIRE', KEYS[1], full_ms + slack)
redis.call('SET', KEYS[2], lh_str(added), 'PX', record_ttl)
return {added, tokens, 0, now}
