-- usage_owed.lua: clears a period's owed marker (issue 30) once a roll-up
-- report of at least its total is committed at the allocator: only when
-- the marker's "q,c" is no larger than the reported totals, so a raise
-- after the report keeps it.
-- KEYS[1]  the owed marker (string "q,c")
-- ARGV     requests, cost: the totals the committed report carried
-- returns  {cleared (1 or 0), now_ms}
local q = lh_int(ARGV[1], 0, LH_MAX)
if not q then return lh_invalid('requests') end
local c = lh_int(ARGV[2], 0, LH_MAX)
if not c then return lh_invalid('cost') end
local now = lh_now_ms()
local held = redis.call('GET', KEYS[1])
if not held then return {0, now} end
local a, b = string.match(held, '^(%d+),(%d+)$')
local hq, hc = lh_int(a, 0, LH_MAX), lh_int(b, 0, LH_MAX)
-- A malformed marker is cleared: nothing can read it.
if hq and hc and (hq > q or hc > c) then return {0, now} end
redis.call('DEL', KEYS[1])
return {1, now}
