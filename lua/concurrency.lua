-- concurrency.lua: a semaphore of expiring leases; acquire is idempotent per
-- lease id (a repeat is a heartbeat), release is ZREM (idempotent).
-- KEYS[1]  sorted set of in-flight leases: member = lease id, score = expiry ms
-- ARGV     "acquire", lease_id, max_in_flight (at most 100000: bounds the set), lease_ttl_ms
--          "release", lease_id   (further arguments are ignored)
-- returns  acquire: {acquired, in_flight, now_ms}; release: {removed, in_flight, now_ms}
-- A lease is live while its expiry is after now. Clock back: leases stay
-- counted until their stored expiry, and a heartbeat never shortens a lease.
local op = ARGV[1]
if op ~= 'acquire' and op ~= 'release' then return lh_invalid('op') end
local lease = ARGV[2]
if type(lease) ~= 'string' or #lease < 1 or #lease > 128
    or not string.match(lease, '^[A-Za-z0-9%._:%-]+$') then
  return lh_invalid('lease_id')
end
local max_in_flight, ttl
if op == 'acquire' then
  max_in_flight = lh_int(ARGV[3], 1, 100000)
  if not max_in_flight then return lh_invalid('max_in_flight') end
  ttl = lh_int(ARGV[4], 1, LH_MAX)
  if not ttl then return lh_invalid('lease_ttl_ms') end
end

local now = lh_now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', lh_str(now))
if op == 'release' then
  local removed = redis.call('ZREM', KEYS[1], lease)
  return {removed, redis.call('ZCARD', KEYS[1]), now}
end

local in_flight = redis.call('ZCARD', KEYS[1])
local held = tonumber(redis.call('ZSCORE', KEYS[1], lease))
if not held then
  if in_flight >= max_in_flight then
    return {0, in_flight, now}
  end
  in_flight = in_flight + 1
end
redis.call('ZADD', KEYS[1], lh_str(math.max(held or 0, now + ttl)), lease)
-- The key lives until its latest lease expires: an earlier lease's TTL never
-- cuts a later one short.
local latest = redis.call('ZRANGE', KEYS[1], '-1', '-1', 'WITHSCORES')
redis.call('PEXPIRE', KEYS[1], lh_str(tonumber(latest[2]) - now))
return {1, in_flight, now}
