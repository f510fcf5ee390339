-- share_write.lua: the Region's syncer writes a rate pool's share record
-- (one per hash tag the pool is spent under, and the pool's summary that
-- the other agents read), fenced by the syncer lease's token.
-- KEYS[1]  the record: hash {c, r, v, e, i, m, iv, f, t, x}
-- ARGV     token ([1, 2^40]), ttl_ms ([1, 2^40]), then capacity, refill,
--          share_version, epoch, incarnation, mode (0 normal, 1 fallback,
--          2 fenced), interval_ms, fallback_allowance (each in [0, 2^40])
-- returns  {written, token, now_ms}
--          written = 1: the record holds these values until now + ttl_ms
--          written = 0: a live record holds a higher token (a newer syncer's):
--                       nothing written, token = that token
local token = lh_int(ARGV[1], 1, LH_MAX)
if not token then return lh_invalid('token') end
local ttl = lh_int(ARGV[2], 1, LH_MAX)
if not ttl then return lh_invalid('ttl_ms') end
if #KEYS ~= 1 or #ARGV ~= 10 then return lh_invalid('record') end
local names = {'c', 'r', 'v', 'e', 'i', 'm', 'iv', 'f'}
local fields = {}
for i = 1, 8 do
  local v = lh_int(ARGV[2 + i], 0, LH_MAX)
  if not v then return lh_invalid(names[i]) end
  fields[#fields + 1] = names[i]
  fields[#fields + 1] = lh_str(v)
end
local now = lh_now_ms()
local held = redis.call('HMGET', KEYS[1], 't', 'x')
local t, x = lh_int(held[1], 1, LH_MAX), lh_int(held[2], 0, 9007199254740991)
if t and x and now <= x and t > token then
  return {0, t, now}
end
fields[#fields + 1] = 't'
fields[#fields + 1] = lh_str(token)
fields[#fields + 1] = 'x'
fields[#fields + 1] = lh_str(now + ttl)
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('PEXPIREAT', KEYS[1], lh_str(now + ttl + LH_EXPIRY_SLACK_MS))
return {1, token, now}
