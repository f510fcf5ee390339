-- sliding_log.lua: exact trailing window (now - window, now], one entry per admit.
-- KEYS[1]  sorted set: member = decision id, score = admit time ms
-- ARGV     limit (at most 100000: the set never holds more members, which
--          bounds memory per key), window_ms, member (decision id)
-- returns  {allowed, remaining, retry_after_ms, now_ms}
-- A replayed member is answered allowed and not counted twice; a denial adds
-- nothing (its trim only drops expired entries). Clock back: entries scored
-- after now stay counted, and the TTL covers the newest entry's window.
local limit = lh_int(ARGV[1], 1, 100000)
if not limit then return lh_invalid('limit') end
local window = lh_int(ARGV[2], 1, LH_MAX)
if not window then return lh_invalid('window_ms') end
local member = ARGV[3]
if type(member) ~= 'string' or #member < 1 or #member > 64
    or not string.match(member, '^[A-Za-z0-9%._:%-]+$') then
  return lh_invalid('member')
end

local now = lh_now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', lh_str(now - window))
local count = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], member) then
  return {1, math.max(0, limit - count), 0, now}
end
if count >= limit then
  -- The entry whose leaving brings the count below the limit (the oldest
  -- one unless the limit was lowered).
  local rank = count - limit
  local entry = redis.call('ZRANGE', KEYS[1], lh_str(rank), lh_str(rank), 'WITHSCORES')
  return {0, 0, tonumber(entry[2]) + window - now, now}
end
redis.call('ZADD', KEYS[1], lh_str(now), member)
-- TTL until the newest entry leaves the window: `window` unless the clock
-- went back (then an entry scored after now is newest). A look (look.lua)
-- drops the ZADD, so the set may have no entry: then `now` is newest.
local newest = redis.call('ZRANGE', KEYS[1], '-1', '-1', 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], lh_str((tonumber(newest[2]) or now) + window - now))
return {1, limit - count - 1, 0, now}
