-- usage_sender.lua: the Region's usage senders and whether each is alive
-- (issue 30). Every usage record (even one carrying no total) beats its
-- sender here; its end record marks it ended. A sender that neither ended
-- nor beat lately is silent: it may have died without its end record, so
-- the Region may lack at most one flush of its counts (never an excess).
-- KEYS[1]  hash: field = sender (identity#incarnation), value =
--          "sequence,ended,last_ms"
-- ARGV     sender ("" = only read), sequence [0, 2^40], ended (0 or 1),
--          ttl_ms [1, 2^40] (the hash's life after a beat), max_senders
--          [1, 65536], ended_retention_ms [0, 2^40], silent_after_ms
--          [1, 2^40]
-- returns  {outcome, senders, ended, silent, now_ms}; outcome 1 = beat,
--          0 = read only, -1 = refused (max_senders senders, none ended
--          long enough ago to forget; nothing written)
if #KEYS ~= 1 then return lh_invalid('keys') end
local sender = ARGV[1]
if type(sender) ~= 'string' or #sender > 200
  or (#sender > 0 and string.match(sender, '^[a-z0-9%._/#:%-]+$') == nil) then
  return lh_invalid('sender')
end
local seq = lh_int(ARGV[2], 0, LH_MAX)
if not seq then return lh_invalid('sequence') end
local ended = lh_int(ARGV[3], 0, 1)
if not ended then return lh_invalid('ended') end
local ttl = lh_int(ARGV[4], 1, LH_MAX)
if not ttl then return lh_invalid('ttl_ms') end
local max_senders = lh_int(ARGV[5], 1, 65536)
if not max_senders then return lh_invalid('max_senders') end
local retention = lh_int(ARGV[6], 0, LH_MAX)
if not retention then return lh_invalid('ended_retention_ms') end
local silent_after = lh_int(ARGV[7], 1, LH_MAX)
if not silent_after then return lh_invalid('silent_after_ms') end
local now = lh_now_ms()

-- A stored value: sequence, ended, last_ms; nil when malformed.
local function held(text)
  local s, e, l = string.match(text, '^(%d+),([01]),(%d+)$')
  local hs, hl = s and lh_int(s, 0, LH_MAX), l and lh_int(l, 0, 9007199254740991)
  if not hs or not hl then return nil end
  return hs, tonumber(e), hl
end

local outcome = 0
if #sender > 0 then
  outcome = 1
  local old = redis.call('HGET', KEYS[1], sender)
  local os, oe = 0, 0
  if old then
    os, oe = held(old)
    if not os then return lh_refused('sender', 'malformed') end
  elseif redis.call('HLEN', KEYS[1]) >= max_senders then
    local all = redis.call('HGETALL', KEYS[1])
    for i = 1, #all, 2 do
      local _, e, l = held(all[i + 1])
      if e == 1 and l + retention < now then
        redis.call('HDEL', KEYS[1], all[i])
      end
    end
    if redis.call('HLEN', KEYS[1]) >= max_senders then outcome = -1 end
  end
  if outcome == 1 then
    redis.call('HSET', KEYS[1], sender,
      lh_str(math.max(os, seq)) .. ',' .. lh_str(math.max(oe, ended)) .. ',' .. lh_str(now))
    redis.call('PEXPIRE', KEYS[1], ttl)
  end
end

local all = redis.call('HGETALL', KEYS[1])
local senders, gone, silent = 0, 0, 0
for i = 2, #all, 2 do
  senders = senders + 1
  local _, e, l = held(all[i])
  if not e then
    silent = silent + 1
  elseif e == 1 then
    gone = gone + 1
  elseif l + silent_after < now then
    silent = silent + 1
  end
end
return {outcome, senders, gone, silent, now}
