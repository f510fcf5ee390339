-- rls_window.lua: an envoyproxy/ratelimit counter: hits in the epoch-aligned
-- window, counted even past the limit (as upstream's INCRBY); the caller
-- compares the count with the limit.
-- KEYS[1]  hash {w, n}: window start ms, hits counted in that window
-- ARGV     window_ms, hits (0 = look only), jitter_ms, stop (0|1), limit,
--          [window_start_ms]: a calendar period's start (its length is
--          window_ms; the key names the period): the window starts there
--          instead of at the epoch-aligned start (absent or 0: aligned)
--          stop = 1: hits that would take n above limit are not stored
--          (upstream's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT for a counter
--          the caller found within); the reply still carries n + hits.
-- TTL      max(window_ms, window end - now) + jitter_ms (upstream: EXPIRE
--          unit + jitter; the max keeps a later stored window alive).
-- returns  {n, window_end_ms, now_ms}: the count after this call
-- Clock back: a stored window starting after the current one is kept, so
-- going back never reopens a window already counted.
local window = lh_int(ARGV[1], 1, LH_MAX)
if not window then return lh_invalid('window_ms') end
local hits = lh_int(ARGV[2], 0, LH_MAX)
if not hits then return lh_invalid('hits') end
local jitter = lh_int(ARGV[3], 0, LH_MAX)
if not jitter then return lh_invalid('jitter_ms') end
local stop = lh_int(ARGV[4], 0, 1)
if not stop then return lh_invalid('stop') end
local limit = lh_int(ARGV[5], 0, LH_MAX)
if not limit then return lh_invalid('limit') end
local start = 0
if ARGV[6] ~= nil then
  start = lh_int(ARGV[6], 0, 9007199254740991)
  if not start then return lh_invalid('window_start_ms') end
end

local now = lh_now_ms()
local w = now - math.fmod(now, window)
if start > 0 then w = start end
local state = redis.call('HMGET', KEYS[1], 'w', 'n')
local sw, n = tonumber(state[1]), tonumber(state[2])
if sw == nil or n == nil or sw < w then
  n = 0
elseif sw > w then
  w = sw
end
if hits > 0 then
  n = math.min(n + hits, LH_MAX)
  if stop == 0 or n <= limit then
    redis.call('HSET', KEYS[1], 'w', lh_str(w), 'n', lh_str(n))
    redis.call('PEXPIRE', KEYS[1], lh_str(math.max(window, w + window - now) + jitter))
  end
end
return {n, w + window, now}
