-- chunk_credit.lua: credit a chunk grant of a window pool to its regional
-- counter, once per lease id (the counter is named after it).
-- KEYS[1]  the chunk's counter: string, millitokens left
-- ARGV     granted_millitokens, ttl_ms (each in [1, 2^40])
-- returns  {credited, left, now_ms}
--          credited = 1: the counter was missing and now holds granted,
--                        expiring at now + ttl_ms (one write)
--          credited = 0: it exists; nothing written, left = its value
local granted = lh_int(ARGV[1], 1, LH_MAX)
if not granted then return lh_invalid('granted_millitokens') end
local ttl = lh_int(ARGV[2], 1, LH_MAX)
if not ttl then return lh_invalid('ttl_ms') end
if #KEYS ~= 1 then return lh_invalid('keys') end

local now = lh_now_ms()
local left = lh_counter(KEYS[1], now)
if left then
  return {0, left, now}
end
-- PXAT on the script's clock: PX would count from Redis's clock at the SET,
-- which can be later than TIME; this way the chunk ends at exactly now + ttl.
redis.call('SET', KEYS[1], lh_str(granted), 'PXAT', lh_str(now + ttl))
return {1, granted, now}
