-- syncer_lease.lua: which agent of a Region talks to the allocator (its
-- syncer), by a lease with a fencing token (ARCHITECTURE §4, several agents
-- per Region). Tokens only grow: the counter key has no expiry.
-- KEYS[1]  the lease: hash {a (agent id), t (token), x (expires_at_ms)}
-- KEYS[2]  the token counter (string)
-- ARGV     op (1 acquire or renew, 2 release), agent_id ([a-z0-9-]{1,32}),
--          ttl_ms ([1, 2^40])
-- returns  {held, token, ttl_left_ms, now_ms}
--          acquire: held = 1 when this agent holds the lease now (renewed
--          until now + ttl_ms; a new holder gets the next token); held = 0
--          when another agent's lease is live: token and ttl_left are its
--          release: held = 1 when this agent held it (the lease is gone)
local op = lh_int(ARGV[1], 1, 2)
if not op then return lh_invalid('op') end
local agent = ARGV[2]
if type(agent) ~= 'string' or #agent < 1 or #agent > 32 or not string.match(agent, '^[a-z0-9-]+$') then
  return lh_invalid('agent_id')
end
local ttl = lh_int(ARGV[3], 1, LH_MAX)
if not ttl then return lh_invalid('ttl_ms') end
if #KEYS ~= 2 or KEYS[1] == KEYS[2] then return lh_invalid('keys') end
local now = lh_now_ms()
local held = redis.call('HMGET', KEYS[1], 'a', 't', 'x')
local a, t, x = held[1], lh_int(held[2], 1, LH_MAX), lh_int(held[3], 0, 9007199254740991)
local live = a and t and x and now <= x
if op == 2 then
  if live and a == agent then
    redis.call('DEL', KEYS[1])
    return {1, t, 0, now}
  end
  return {0, t or 0, 0, now}
end
if live and a ~= agent then
  return {0, t, x - now, now}
end
if not live then
  local n = lh_int(redis.call('GET', KEYS[2]) or '0', 0, LH_MAX)
  if not n or n >= LH_MAX then return lh_invalid('token') end
  t = n + 1
  redis.call('SET', KEYS[2], lh_str(t))
end
redis.call('HSET', KEYS[1], 'a', agent, 't', lh_str(t), 'x', lh_str(now + ttl))
redis.call('PEXPIREAT', KEYS[1], lh_str(now + ttl + LH_EXPIRY_SLACK_MS))
return {1, t, ttl, now}
