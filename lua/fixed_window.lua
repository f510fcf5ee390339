-- fixed_window.lua: one counter per epoch-aligned window; a denial writes nothing.
-- KEYS[1]  hash {w, n}: window start ms, units admitted in that window
-- ARGV     limit, window_ms, cost, slack_ms
-- returns  {allowed, remaining, retry_after_ms, now_ms}; retry -1 = can never succeed
-- Clock back: the stored window is kept while it starts after the current one,
-- so going back never reopens a window that is already spent.
local limit = lh_int(ARGV[1], 1, LH_MAX)
if not limit then return lh_invalid('limit') end
local window = lh_int(ARGV[2], 1, LH_MAX)
if not window then return lh_invalid('window_ms') end
if limit * window > LH_MAX_PRODUCT then return lh_invalid('limit') end
local cost = lh_int(ARGV[3], 1, LH_MAX)
if not cost then return lh_invalid('cost') end
local slack = lh_int(ARGV[4], 0, LH_MAX)
if not slack then return lh_invalid('slack_ms') end

local now = lh_now_ms()
if cost > limit then
  return {0, 0, -1, now}
end

local w = now - math.fmod(now, window)
local state = redis.call('HMGET', KEYS[1], 'w', 'n')
local sw, n = tonumber(state[1]), tonumber(state[2])
if sw == nil or n == nil or sw < w then
  n = 0
elseif sw > w then
  w = sw
end

local ms_left = w + window - now
if n + cost <= limit then
  n = n + cost
  redis.call('HSET', KEYS[1], 'w', lh_str(w), 'n', lh_str(n))
  redis.call('PEXPIRE', KEYS[1], lh_str(ms_left + slack))
  return {1, limit - n, 0, now}
end
return {0, math.max(0, limit - n), ms_left, now}
