-- lease_block.lua: grant a gateway a whole block of B millitokens from one
-- token bucket, or nothing; never a partial block. A grant records the lease
-- (so give_back can accept only what was leased) in the same call; a denial
-- writes nothing.
-- KEYS[1]  hash {tokens, ts}
-- KEYS[2]  lease record for the lease id (same hash tag): string
--          "granted,expires_at_ms,granted_at_ms,holder,domain,rule" (prelude.lua)
-- ARGV     capacity, refill, period_ms, block (B millitokens), gateways (N), slack_ms,
--          lease_ttl_ms ([1, 2^40]: how long a return of the block is accepted),
--          holder (the caller's verified identity, e.g. gateway/eu, or
--          anonymous; 1-96 of [a-z0-9._/-]), domain (1-30 of [a-z0-9-]) and
--          rule (1-64 of [a-z0-9_-]) the block is of: recorded, never a principal
-- returns  {granted, remaining, denied_until_ms, now_ms}
--          granted = B or 0; denied_until_ms = 0 when granted,
--          now + min(N x ceil(B x period / refill), 2^40) when not, -1 when B > capacity (never)
-- A lease id whose record is live (now <= expires_at_ms): a retry of that
-- lease (same block, not yet given back, by the same holder when the record
-- names one) is answered with the block again, charged once and nothing
-- written (remaining = the refilled tokens); anything else is refused:
-- "lease_id refused: taken", nothing written.
local capacity, refill, period = lh_rate(ARGV, 1)
if not capacity then return lh_invalid(refill) end
local block = lh_int(ARGV[4], 1, LH_MAX)
if not block then return lh_invalid('block') end
local gateways = lh_int(ARGV[5], 1, 1024)
if not gateways then return lh_invalid('gateways') end
local slack = lh_int(ARGV[6], 0, LH_MAX)
if not slack then return lh_invalid('slack_ms') end
local lease_ttl = lh_int(ARGV[7], 1, LH_MAX)
if not lease_ttl then return lh_invalid('lease_ttl_ms') end
local holder, domain, rule = ARGV[8], ARGV[9], ARGV[10]
if not lh_lease_label(holder, LH_LEASE_HOLDER, 96) then return lh_invalid('holder') end
if not lh_lease_label(domain, LH_LEASE_DOMAIN, 30) then return lh_invalid('domain') end
if not lh_lease_label(rule, LH_LEASE_RULE, 64) then return lh_invalid('rule') end
if #KEYS ~= 2 or KEYS[1] == KEYS[2] then return lh_invalid('keys') end

local now = lh_now_ms()
local prior = redis.call('GET', KEYS[2])
if prior then
  local granted, expires_at, returned, _, held_by = lh_lease_record(prior)
  if not granted then return lh_invalid('lease_record') end
  if now <= expires_at then
    -- Another holder's id is taken too: a retry comes from the same caller.
    if returned or granted ~= block or (held_by and held_by ~= holder) then
      return lh_refused('lease_id', 'taken')
    end
    local tokens = lh_bucket(KEYS[1], capacity, refill, period, now)
    return {block, tokens, 0, now}
  end
end
if block > capacity then
  return {0, 0, -1, now}
end

local tokens, ts, full_ms = lh_bucket(KEYS[1], capacity, refill, period, now)

if tokens >= block then
  tokens = tokens - block
  redis.call('HSET', KEYS[1], 'tokens', lh_str(tokens), 'ts', lh_str(ts))
  redis.call('PEXPIRE', KEYS[1], full_ms + slack)
  -- PXAT on the script's clock: the record ends exactly at its expires_at_ms.
  redis.call('SET', KEYS[2], lh_lease_text(block, now + lease_ttl, nil, now, holder, domain, rule),
    'PXAT', lh_str(now + lease_ttl))
  return {block, tokens, 0, now}
end
-- N gateways each waiting for a block: exact while below 2^40 (the product
-- may round above 2^53, but then it is far above the cap and min() is exact).
local wait = math.min(gateways * math.ceil(block * period / refill), LH_MAX)
return {0, tokens, now + wait, now}
