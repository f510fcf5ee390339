-- usage_record.lua: one sender's running totals of one (tenant, meter),
-- kept larger-wins, and what they grew by added to the Region's total of
-- the period now (issue 30). A record delivered twice or out of order
-- raises nothing, so it changes nothing.
-- KEYS[1]  hash of the meter's senders: field = sender, value =
--          "requests,cost,sequence,ended,last_ms"
-- KEYS[2]  hash of the Region's total of the period {q, c}
-- KEYS[3]  the period's owed marker: "q,c", the total after the last raise
--          not yet known to be rolled up to the allocator (an agent
--          clears it once its report of at least that total is committed;
--          an agent starting finds the markers a dead one left)
-- ARGV     sender (1-200 bytes of [a-z0-9._/#:-]: identity#incarnation),
--          requests, cost (running totals since the sender started, each
--          in [0, 2^40]), sequence [0, 2^40], ended (0 or 1),
--          total_expire_at_ms [1, 2^53 - 1] (after now: the period's end
--          plus its retention), senders_ttl_ms [1, 2^40], max_senders
--          [1, 65536], ended_retention_ms [0, 2^40]
-- returns  {outcome, added_requests, added_cost, total_requests,
--          total_cost, now_ms}; outcome 1 = the sender's record changed,
--          0 = nothing larger (a duplicate, an older record), -1 = refused:
--          the meter has max_senders senders and none ended long enough
--          ago to forget (nothing written)
if #KEYS ~= 3 then return lh_invalid('keys') end
local sender = ARGV[1]
if type(sender) ~= 'string' or #sender < 1 or #sender > 200
  or string.match(sender, '^[a-z0-9%._/#:%-]+$') == nil then
  return lh_invalid('sender')
end
local q = lh_int(ARGV[2], 0, LH_MAX)
if not q then return lh_invalid('requests') end
local c = lh_int(ARGV[3], 0, LH_MAX)
if not c then return lh_invalid('cost') end
local seq = lh_int(ARGV[4], 0, LH_MAX)
if not seq then return lh_invalid('sequence') end
local ended = lh_int(ARGV[5], 0, 1)
if not ended then return lh_invalid('ended') end
local expire_at = lh_int(ARGV[6], 1, 9007199254740991)
if not expire_at then return lh_invalid('total_expire_at_ms') end
local senders_ttl = lh_int(ARGV[7], 1, LH_MAX)
if not senders_ttl then return lh_invalid('senders_ttl_ms') end
local max_senders = lh_int(ARGV[8], 1, 65536)
if not max_senders then return lh_invalid('max_senders') end
local retention = lh_int(ARGV[9], 0, LH_MAX)
if not retention then return lh_invalid('ended_retention_ms') end
local now = lh_now_ms()
if expire_at <= now then return lh_invalid('total_expire_at_ms') end

-- A stored record: requests, cost, sequence, ended, last_ms; nil when
-- malformed (never read as zero: that would count its totals again).
local function held(text)
  local a, b, s, e, l = string.match(text, '^(%d+),(%d+),(%d+),([01]),(%d+)$')
  if not a then return nil end
  local hq, hc, hs = lh_int(a, 0, LH_MAX), lh_int(b, 0, LH_MAX), lh_int(s, 0, LH_MAX)
  local hl = lh_int(l, 0, 9007199254740991)
  if not hq or not hc or not hs or not hl then return nil end
  return hq, hc, hs, tonumber(e), hl
end

local function totals()
  local t = redis.call('HMGET', KEYS[2], 'q', 'c')
  return lh_int(t[1], 0, LH_MAX) or 0, lh_int(t[2], 0, LH_MAX) or 0
end

local oq, oc, os, oe = 0, 0, 0, 0
local old = redis.call('HGET', KEYS[1], sender)
if old then
  oq, oc, os, oe = held(old)
  if not oq then return lh_refused('sender', 'malformed') end
elseif redis.call('HLEN', KEYS[1]) >= max_senders then
  -- Forget senders that ended more than the retention ago: nothing of
  -- theirs can still be on its way (a sender sends nothing after its end).
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local _, _, _, e, l = held(all[i + 1])
    if e == 1 and l + retention < now then
      redis.call('HDEL', KEYS[1], all[i])
    end
  end
  if redis.call('HLEN', KEYS[1]) >= max_senders then
    local tq, tc = totals()
    return {-1, 0, 0, tq, tc, now}
  end
end

local nq, nc = math.max(oq, q), math.max(oc, c)
local ns, ne = math.max(os, seq), math.max(oe, ended)
local dq, dc = nq - oq, nc - oc
local changed = (not old) or dq > 0 or dc > 0 or ns ~= os or ne ~= oe
if changed then
  redis.call('HSET', KEYS[1], sender,
    lh_str(nq) .. ',' .. lh_str(nc) .. ',' .. lh_str(ns) .. ',' .. lh_str(ne) .. ',' .. lh_str(now))
  redis.call('PEXPIRE', KEYS[1], senders_ttl)
end
local tq, tc = totals()
if dq > 0 or dc > 0 then
  tq, tc = math.min(tq + dq, LH_MAX), math.min(tc + dc, LH_MAX)
  redis.call('HSET', KEYS[2], 'q', lh_str(tq), 'c', lh_str(tc))
  redis.call('PEXPIREAT', KEYS[2], expire_at)
  redis.call('SET', KEYS[3], lh_str(tq) .. ',' .. lh_str(tc), 'PXAT', lh_str(expire_at))
end
return {changed and 1 or 0, dq, dc, tq, tc, now}
