-- Shared prelude, prepended to every Leasehold script before it is loaded
-- (see crates/region-agent/src/script.rs). Keep it tiny: it runs on every call.

-- The store's clock in milliseconds: the one clock of the regional data plane.
local function lh_now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Strict integer argument: ASCII digits only (no sign, exponent, hex, "nan",
-- "inf" or spaces), at most 16 of them, and within [min, max]. Returns nil
-- when invalid so the caller can answer lh_invalid(name).
-- Parsing a digit string (pattern test + strtod) costs far more than the
-- whole rest of a decision's arithmetic, and one call repeats the same few
-- strings (a pack of one rule's decisions: the same capacity, refill,
-- period, cost, slack and framing counts), so each distinct string is
-- parsed once per script call. Lua strings are interned: the lookup is a
-- pointer hash. Bounded by the call's own arguments and the values it reads.
local lh_parsed = {}
local function lh_int(s, min, max)
  if type(s) ~= 'string' then return nil end
  local v = lh_parsed[s]
  if v == nil then
    v = #s > 0 and #s <= 16 and string.find(s, '^%d+$') ~= nil and tonumber(s)
    lh_parsed[s] = v
  end
  if not v or v < min or v > max then
    return nil
  end
  return v
end

local function lh_invalid(name)
  return redis.error_reply('ERR leasehold: ' .. name .. ' invalid')
end

-- A well-formed request the data plane refuses (a reused id, a lease that is
-- not live): nothing was written. `reason` is one fixed word, never request data.
local function lh_refused(name, reason)
  return redis.error_reply('ERR leasehold: ' .. name .. ' refused: ' .. reason)
end

-- Decimal text of an integer-valued number. tostring() uses %.14g and would
-- round values above 10^14; %d keeps every digit up to 2^53.
local function lh_str(v)
  return string.format('%d', v)
end

local LH_MAX = 1099511627776        -- 2^40: largest count, rate, period or cost
-- How long a record that says when it ends (an `x` field) outlives that
-- instant in Redis: PEXPIREAT checks its instant against Redis's own clock,
-- read after the script's TIME, so an instant within a millisecond or two
-- of TIME could drop the key at once. Liveness is the record's own field.
local LH_EXPIRY_SLACK_MS = 1000
local LH_MAX_PRODUCT = 4503599627370496 -- 2^52: largest capacity x period_ms

-- A rate at argv[i], argv[i+1], argv[i+2]: capacity, refill, period_ms, each
-- in [1, 2^40], with capacity x period <= 2^52 so every product below stays
-- exact in doubles. Returns the three values, or nil and the name of the
-- first invalid argument.
-- argv is the caller's ARGV, passed rather than read as the global so that
-- multi_decision can run a script body on its own sub-call's arguments.
local function lh_rate(argv, i)
  local capacity = lh_int(argv[i], 1, LH_MAX)
  if not capacity then return nil, 'capacity' end
  local refill = lh_int(argv[i + 1], 1, LH_MAX)
  if not refill then return nil, 'refill' end
  local period = lh_int(argv[i + 2], 1, LH_MAX)
  if not period then return nil, 'period_ms' end
  if capacity * period > LH_MAX_PRODUCT then return nil, 'capacity' end
  return capacity, refill, period
end

-- A token bucket's hash {tokens, ts} after lazy refill at now (§2): a missing
-- bucket is full; clock back gives no refill and ts never moves back; far
-- forward refills at most a full bucket; tokens are clamped to the capacity
-- in force. Returns tokens, the ts to store, and the full-refill time in ms.
local function lh_bucket(key, capacity, refill, period, now)
  local full_ms = math.ceil(capacity * period / refill)
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens, ts = tonumber(state[1]), tonumber(state[2])
  if tokens == nil or ts == nil then
    return capacity, now, full_ms
  end
  local elapsed = math.min(math.max(0, now - ts), full_ms)
  return math.min(capacity, tokens + math.floor(elapsed * refill / period)), math.max(ts, now), full_ms
end

-- A chunk counter (a string of millitokens) as seen at now: its value and
-- absolute expiry in ms (-1: none), or nil when missing. Expiry is judged on
-- the script's clock (expired when now > expiry, as Redis decides), not on
-- Redis's own snapshot taken a little earlier, so the twin sees the same
-- keys. A value that is not a canonical integer in [0, 2^40] (what DECRBY
-- could not parse, or what no chunk_credit wrote) reads as 0. PEXPIRETIME
-- needs Redis 7.0 or later.
local function lh_counter(key, now)
  local v = redis.call('GET', key)
  if not v then return nil end
  local at = redis.call('PEXPIRETIME', key)
  if at >= 0 and now > at then return nil end
  local n = lh_int(v, 0, LH_MAX)
  if not n or (#v > 1 and string.sub(v, 1, 1) == '0') then n = 0 end
  return n, at
end

-- A block lease record. Two shapes are read:
--   "granted,expires_at_ms[,returned]"  as agents before the lease list wrote it;
--   "granted,expires_at_ms,granted_at_ms,holder,domain,rule[,returned]"  as
--   lease_block writes it now: who holds the block (the caller's verified
--   identity, e.g. gateway/eu; `anonymous` on a plaintext listener) and of
--   which rule, so `leasehold lease list` can show it. No field is a
--   principal: keys and records hold only HMAC'd principals.
-- granted in [1, 2^40], expires_at_ms and granted_at_ms in [0, 2^53 - 1]
-- (larger text may round in tonumber), returned in [0, 2^40]; holder
-- 1-96 bytes of [a-z0-9._/-], domain 1-30 of [a-z0-9-], rule 1-64 of
-- [a-z0-9_-]. Returns granted, expires_at, returned (nil while not
-- returned), then granted_at, holder, domain, rule (all nil in an old
-- record); nil when malformed.
local LH_LEASE_HOLDER = '^[a-z0-9%._/%-]+$'
local LH_LEASE_DOMAIN = '^[a-z0-9%-]+$'
local LH_LEASE_RULE = '^[a-z0-9_%-]+$'

-- Whether `s` is 1 to max_len bytes matching `pattern` (a lease label).
local function lh_lease_label(s, pattern, max_len)
  return type(s) == 'string' and #s >= 1 and #s <= max_len and string.match(s, pattern) ~= nil
end

local function lh_lease_record(text)
  local g, e, r = string.match(text, '^(%d+),(%d+)$')
  local a, h, d, u
  if not g then
    g, e, r = string.match(text, '^(%d+),(%d+),(%d+)$')
  end
  if not g then
    g, e, a, h, d, u = string.match(text, '^(%d+),(%d+),(%d+),([^,]+),([^,]+),([^,]+)$')
  end
  if not g then
    g, e, a, h, d, u, r = string.match(text, '^(%d+),(%d+),(%d+),([^,]+),([^,]+),([^,]+),(%d+)$')
    if not g then return nil end
  end
  local granted = lh_int(g, 1, LH_MAX)
  local expires_at = lh_int(e, 0, 9007199254740991)
  local returned = nil
  if r then
    returned = lh_int(r, 0, LH_MAX)
    if not returned then return nil end
  end
  if not granted or not expires_at then return nil end
  if not a then return granted, expires_at, returned end
  local granted_at = lh_int(a, 0, 9007199254740991)
  if not granted_at or not lh_lease_label(h, LH_LEASE_HOLDER, 96)
    or not lh_lease_label(d, LH_LEASE_DOMAIN, 30) or not lh_lease_label(u, LH_LEASE_RULE, 64) then
    return nil
  end
  return granted, expires_at, returned, granted_at, h, d, u
end

-- A lease record's text in the shape it was read in (an old record stays
-- old: give_back marks it returned without inventing its holder).
local function lh_lease_text(granted, expires_at, returned, granted_at, holder, domain, rule)
  local text = lh_str(granted) .. ',' .. lh_str(expires_at)
  if granted_at then
    text = text .. ',' .. lh_str(granted_at) .. ',' .. holder .. ',' .. domain .. ',' .. rule
  end
  if returned then text = text .. ',' .. lh_str(returned) end
  return text
end
