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
local function lh_int(s, min, max)
  if type(s) ~= 'string' or #s == 0 or #s > 16 or not string.match(s, '^%d+$') then
    return nil
  end
  local v = tonumber(s)
  if v < min or v > max then
    return nil
  end
  return v
end

local function lh_invalid(name)
  return redis.error_reply('ERR leasehold: ' .. name .. ' invalid')
end

-- Decimal text of an integer-valued number. tostring() uses %.14g and would
-- round values above 10^14; %d keeps every digit up to 2^53.
local function lh_str(v)
  return string.format('%d', v)
end

local LH_MAX = 1099511627776        -- 2^40: largest count, rate, period or cost
local LH_MAX_PRODUCT = 4503599627370496 -- 2^52: largest capacity x period_ms
