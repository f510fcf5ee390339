-- give_back.lua: return unused millitokens of a recorded block lease to its
-- token bucket, never above capacity and never more than the block; once per
-- lease (the record is marked with the returned amount).
-- KEYS[1]  bucket hash {tokens, ts}
-- KEYS[2]  lease record written by lease_block (same hash tag), in either
--          shape lh_lease_record reads; once returned it ends in ",returned"
-- ARGV     capacity, refill, period_ms, tokens (millitokens to return), slack_ms,
--          holder (the caller's verified identity, as lease_block takes it)
-- returns  {added, tokens_after, replayed, now_ms}
--          replayed = 1: this lease was already returned with the same amount
--          (a retry): nothing written, added = 0
-- Refused, nothing written: no live record ("lease_id refused: unknown", also
-- when now > expires_at_ms or when the record names another holder: a
-- caller returns only its own blocks), returned before with another amount
-- ("lease_id refused: returned"), more than the block ("tokens refused: above_block").
local capacity, refill, period = lh_rate(ARGV, 1)
if not capacity then return lh_invalid(refill) end
local give = lh_int(ARGV[4], 0, LH_MAX)
if not give then return lh_invalid('tokens') end
local slack = lh_int(ARGV[5], 0, LH_MAX)
if not slack then return lh_invalid('slack_ms') end
local holder = ARGV[6]
if not lh_lease_label(holder, LH_LEASE_HOLDER, 96) then return lh_invalid('holder') end
if #KEYS ~= 2 or KEYS[1] == KEYS[2] then return lh_invalid('keys') end

local now = lh_now_ms()
local record = redis.call('GET', KEYS[2])
if not record then return lh_refused('lease_id', 'unknown') end
local granted, expires_at, returned, granted_at, held_by, domain, rule = lh_lease_record(record)
if not granted then return lh_invalid('lease_record') end
-- Redis judges expiry on its own snapshot, a little before TIME: judge it
-- on the script's clock, as the twin does.
if now > expires_at then return lh_refused('lease_id', 'unknown') end
-- Not this caller's lease: as unknown, so the answer tells nothing of it.
if held_by and held_by ~= holder then return lh_refused('lease_id', 'unknown') end
if returned and returned ~= give then return lh_refused('lease_id', 'returned') end
if give > granted then return lh_refused('tokens', 'above_block') end

local tokens, ts, full_ms = lh_bucket(KEYS[1], capacity, refill, period, now)

if returned then
  return {0, tokens, 1, now}
end
local added = math.min(give, capacity - tokens)
tokens = tokens + added
redis.call('HSET', KEYS[1], 'tokens', lh_str(tokens), 'ts', lh_str(ts))
redis.call('PEXPIRE', KEYS[1], full_ms + slack)
redis.call('SET', KEYS[2],
  lh_lease_text(granted, expires_at, give, granted_at, held_by, domain, rule), 'KEEPTTL')
return {added, tokens, 0, now}
