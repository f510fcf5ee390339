-- pool_demand.lua: what every agent of a Region saw of a global pool since
-- the syncer last looked: requests (the demand a Rebalance reports) and
-- millitokens spent from chunks (how the syncer's chunk holder learns what
-- the other agents spent).
-- KEYS[1]  hash {q, s}
-- ARGV     requests, spent_millitokens (each in [0, 2^40]: added), take (0 or 1),
--          ttl_ms ([1, 2^40]: the counts are dropped when no agent adds or takes for so long)
-- returns  {requests, spent_millitokens, now_ms}: the totals after adding;
--          with take = 1 they are also reset to 0 (the syncer took them)
local q = lh_int(ARGV[1], 0, LH_MAX)
if not q then return lh_invalid('requests') end
local s = lh_int(ARGV[2], 0, LH_MAX)
if not s then return lh_invalid('spent_millitokens') end
local take = lh_int(ARGV[3], 0, 1)
if not take then return lh_invalid('take') end
local ttl = lh_int(ARGV[4], 1, LH_MAX)
if not ttl then return lh_invalid('ttl_ms') end
if #KEYS ~= 1 then return lh_invalid('keys') end
local now = lh_now_ms()
local held = redis.call('HMGET', KEYS[1], 'q', 's')
-- Totals are capped at 2^40, as every count the agent reports.
local tq = math.min((lh_int(held[1], 0, LH_MAX) or 0) + q, LH_MAX)
local ts = math.min((lh_int(held[2], 0, LH_MAX) or 0) + s, LH_MAX)
if take == 1 then
  redis.call('DEL', KEYS[1])
elseif q > 0 or s > 0 then
  redis.call('HSET', KEYS[1], 'q', lh_str(tq), 's', lh_str(ts))
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return {tq, ts, now}
