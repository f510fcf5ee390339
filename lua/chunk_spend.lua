-- chunk_spend.lua: spend from a window pool's chunk counters, all or nothing.
-- KEYS     1 to 16 distinct chunk counters, earliest-expiring first
-- ARGV     cost_millitokens ([1, 2^40])
-- returns  {spent, left, expires_in_ms, now_ms}
--          available = sum of the live counters (missing or expired: 0)
--          spent = 0: available < cost; nothing written, left = available,
--                     expires_in_ms = 0
--          spent = 1: cost debited in KEYS order, each counter drained before
--                     the next (DECRBY keeps the TTL; a drained counter stays
--                     at 0); left = available - cost; expires_in_ms = the
--                     least time to live of the counters debited (-1 if none
--                     of them expires), so a block drawn from them can be
--                     made to end no later than the earliest of them
local MAX_KEYS = 16
local cost = lh_int(ARGV[1], 1, LH_MAX)
if not cost then return lh_invalid('cost_millitokens') end
if #KEYS < 1 or #KEYS > MAX_KEYS then return lh_invalid('keys') end
for i = 2, #KEYS do
  for j = 1, i - 1 do
    if KEYS[i] == KEYS[j] then return lh_invalid('keys') end
  end
end

local now = lh_now_ms()
local held, at = {}, {}
local available = 0
for i = 1, #KEYS do
  local n, expires_at = lh_counter(KEYS[i], now)
  held[i], at[i] = n or 0, expires_at or -1
  available = available + held[i]
end
if available < cost then
  return {0, available, 0, now}
end

local rest, expires_in = cost, -1
for i = 1, #KEYS do
  if rest == 0 then break end
  local take = math.min(rest, held[i])
  if take > 0 then
    redis.call('DECRBY', KEYS[i], lh_str(take))
    rest = rest - take
    if at[i] >= 0 and (expires_in < 0 or at[i] - now < expires_in) then
      expires_in = at[i] - now
    end
  end
end
return {1, available - cost, expires_in, now}
