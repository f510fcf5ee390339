-- share_read.lua: an agent reads a rate pool's share record (the summary
-- its syncer wrote) to size its own view: blocks, status, the bucket it
-- asks for (share_gate still applies the record at every decision).
-- KEYS[1]  the record (see share_write.lua)
-- returns  {present, capacity, refill, share_version, epoch, incarnation,
--           mode, interval_ms, fallback_allowance, token, expires_at_ms, now_ms}
--          present = 0 (all zeros) when missing, expired (now > x) or malformed
local now = lh_now_ms()
if #KEYS ~= 1 then return lh_invalid('keys') end
local s = redis.call('HMGET', KEYS[1], 'c', 'r', 'v', 'e', 'i', 'm', 'iv', 'f', 't', 'x')
local out = {1}
for i = 1, 9 do
  local v = lh_int(s[i], 0, LH_MAX)
  if not v then return {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, now} end
  out[#out + 1] = v
end
local x = lh_int(s[10], 0, 9007199254740991)
if not x or now > x then return {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, now} end
out[#out + 1] = x
out[#out + 1] = now
return out
