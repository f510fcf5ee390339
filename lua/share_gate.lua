-- share_gate.lua: runs token_bucket, multi_rule or lease_block under the
-- rate-pool shares a Region's syncer wrote into Redis (several agents per
-- Region, ARCHITECTURE §4.3). Each gated (capacity, refill) pair of the
-- inner call is lowered to its share record's in the same atomic call, so a
-- share lowered in Redis is in force for every agent of the Region at once,
-- whatever each agent last read.
-- KEYS[1..g]   share records, hash {c, r, x, t}: capacity and refill
--              (millitokens), expires_at_ms (store time), fencing token;
--              the records' hash tag is the buckets' (the caller's duty)
-- KEYS[g+1..]  the inner call's keys
-- ARGV         inner script name, g in [1, 8], g positions (1-based index
--              into the inner ARGV of a capacity; its refill follows), then
--              the inner call's ARGV
-- returns      the inner call's reply
-- A record missing, expired (now > x) or holding 0 means no room: the pair
-- becomes (1, 1) millitoken, below every cost the agent sends (>= 1 token),
-- so the inner script refuses (retry -1) and writes nothing. TIME is read
-- once (script.rs shadows lh_now_ms), so the gate and the inner call decide
-- at one store time.
local name = ARGV[1]
local run = LH_SCRIPTS[name]
if not run or (name ~= 'token_bucket' and name ~= 'multi_rule' and name ~= 'lease_block') then
  return lh_invalid('gated')
end
local g = lh_int(ARGV[2], 1, 8)
if not g or #KEYS <= g or #ARGV < 3 + g then return lh_invalid('gates') end
local keys, args = {}, {}
for i = g + 1, #KEYS do keys[#keys + 1] = KEYS[i] end
for i = 3 + g, #ARGV do args[#args + 1] = ARGV[i] end
local now = lh_now_ms()
for i = 1, g do
  local p = lh_int(ARGV[2 + i], 1, #args - 1)
  if not p then return lh_invalid('gates') end
  local s = redis.call('HMGET', KEYS[i], 'c', 'r', 'x')
  local c, r, x = lh_int(s[1], 0, LH_MAX), lh_int(s[2], 0, LH_MAX), lh_int(s[3], 0, 9007199254740991)
  if not c or not r or not x or now > x or c == 0 or r == 0 then
    c, r = 1, 1
  end
  local have_c, have_r = lh_int(args[p], 1, LH_MAX), lh_int(args[p + 1], 1, LH_MAX)
  if have_c and c < have_c then args[p] = lh_str(c) end
  if have_r and r < have_r then args[p + 1] = lh_str(r) end
end
return run(keys, args)
