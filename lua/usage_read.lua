-- usage_read.lua: the Region's total of a meter in one period, read-only
-- (issue 30).
-- KEYS[1]  the period's total hash {q, c} (usage_record.lua)
-- returns  {total_requests, total_cost, now_ms}
if #KEYS ~= 1 then return lh_invalid('keys') end
local now = lh_now_ms()
local t = redis.call('HMGET', KEYS[1], 'q', 'c')
return {lh_int(t[1], 0, LH_MAX) or 0, lh_int(t[2], 0, LH_MAX) or 0, now}
