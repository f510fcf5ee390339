-- sliding_counter.lua: approximate trailing window from two counters; a
-- denial writes nothing. Integer form of est = prev × (1 − elapsed/W) + cur:
-- every comparison is multiplied through by W, and each product stays ≤ 2^52.
-- KEYS[1]  hash {w, cur, prev}: current window start ms, units in it, units in the one before
-- ARGV     limit, window_ms, cost
-- returns  {allowed, remaining, retry_after_ms, now_ms}; retry -1 = can never succeed
-- Clock back: a stored window that starts after the current one is kept
-- (with prev at full weight), so going back never rolls counts away.
local limit = lh_int(ARGV[1], 1, LH_MAX)
if not limit then return lh_invalid('limit') end
local window = lh_int(ARGV[2], 1, LH_MAX)
if not window then return lh_invalid('window_ms') end
if limit * window > LH_MAX_PRODUCT then return lh_invalid('limit') end
local cost = lh_int(ARGV[3], 1, LH_MAX)
if not cost then return lh_invalid('cost') end

local now = lh_now_ms()
if cost > limit then
  return {0, 0, -1, now}
end

local function floor_div(a, b) -- a ≥ 0, b > 0, both exact integers
  return (a - math.fmod(a, b)) / b
end

local w = now - math.fmod(now, window)
local s = redis.call('HMGET', KEYS[1], 'w', 'cur', 'prev')
local cw, cur, prev = tonumber(s[1]), tonumber(s[2]) or 0, tonumber(s[3]) or 0
if cw == nil or w - cw >= 2 * window then
  cur, prev = 0, 0
elseif cw > w then
  w = cw
elseif w - cw == window then
  prev, cur = cur, 0
end
-- A lowered limit: counts above it decide the same, and the products stay exact.
cur, prev = math.min(cur, limit), math.min(prev, limit)

local elapsed = math.max(0, now - w)
local weight = window - elapsed -- prev's overlap with the trailing window, in ms
local room = limit - cur - cost  -- allowed iff prev × weight ≤ room × window
local allowed = room >= 0 and prev * weight <= room * window
if allowed then
  cur = cur + cost
  redis.call('HSET', KEYS[1], 'w', lh_str(w), 'cur', lh_str(cur), 'prev', lh_str(prev))
  redis.call('PEXPIRE', KEYS[1], lh_str(2 * window + math.max(0, w - now)))
end
local spare = (limit - cur) * window - prev * weight
local remaining = 0
if spare > 0 then
  remaining = floor_div(spare, window)
end
if allowed then
  return {1, remaining, 0, now}
end
-- Smallest offset e in the window with prev × (window − e) ≤ room × window;
-- else the window's end.
local retry_at = w + window
if room >= 0 and prev > 0 then
  local e = window - floor_div(room * window, prev)
  if e < window then
    retry_at = w + e
  end
end
return {0, remaining, retry_at - now, now}
