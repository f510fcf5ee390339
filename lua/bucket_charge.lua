-- bucket_charge.lua: an admitted request's real cost charged after the
-- fact (issue 30: an AI gateway learns the tokens once the response is
-- done), into debt down to max_debt. A debt is time the bucket stays
-- empty: its `ts` moves past now by debt / rate, so every script that
-- reads a bucket (lh_bucket) refuses until the debt is repaid, without
-- knowing of debts. Charged once per record key: a retry charges nothing.
-- KEYS[1]  hash {tokens, ts}: the bucket
-- KEYS[2]  the charge's record (the request id and rule), in the bucket's slot
-- ARGV     capacity, refill, period_ms (millitokens / ms), cost
--          (millitokens, [1, 2^40]), max_debt (millitokens, [0, capacity]),
--          slack_ms, record_ttl_ms [1, 2^40]
-- returns  {outcome, tokens, debt_ms, forgiven_ms, now_ms}: outcome 1 =
--          charged, 0 = a retry (nothing charged); tokens after; debt_ms =
--          how long the bucket stays empty (0: no debt); forgiven_ms = the
--          part of this charge past max_debt, not charged (as time at the
--          refill rate)
local capacity, refill, period = lh_rate(ARGV, 1)
if not capacity then return lh_invalid(refill) end
local cost = lh_int(ARGV[4], 1, LH_MAX)
if not cost then return lh_invalid('cost') end
local max_debt = lh_int(ARGV[5], 0, capacity)
if not max_debt then return lh_invalid('max_debt') end
local slack = lh_int(ARGV[6], 0, LH_MAX)
if not slack then return lh_invalid('slack_ms') end
local record_ttl = lh_int(ARGV[7], 1, LH_MAX)
if not record_ttl then return lh_invalid('record_ttl_ms') end

local now = lh_now_ms()
local tokens, ts, full_ms = lh_bucket(KEYS[1], capacity, refill, period, now)
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {0, tokens, ts - now, 0, now}
end
local forgiven = 0
if tokens >= cost then
  tokens = tokens - cost
else
  -- What the tokens held do not cover, capped (beyond capacity + max_debt
  -- it would be forgiven anyway): times stay below 2^53.
  local deficit = math.min(cost - tokens, capacity + max_debt)
  local owed_ms = ts - now
  local new_ms = math.ceil(deficit * period / refill)
  local max_ms = math.floor(max_debt * period / refill)
  -- A debt already deeper than the cap (a lower max_debt since) stays.
  local total = math.min(owed_ms + new_ms, math.max(max_ms, owed_ms))
  forgiven = owed_ms + new_ms - total
  tokens = 0
  ts = now + total
end
redis.call('HSET', KEYS[1], 'tokens', lh_str(tokens), 'ts', lh_str(ts))
redis.call('PEXPIRE', KEYS[1], lh_str(ts - now + full_ms + slack))
redis.call('SET', KEYS[2], '1', 'PX', lh_str(record_ttl))
return {1, tokens, ts - now, forgiven, now}
