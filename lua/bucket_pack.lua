-- bucket_pack.lua: K single-rule token-bucket decisions in one call, each
-- exactly a multi_rule call of one enforcing rule, no shadow and no record
-- (the cold path of a Check). Each decision is still atomic and independent,
-- decided in order (a later one sees an earlier one's write), all at one
-- TIME. The agent validated the rules at policy load and sends each
-- distinct rule once; what stays here is the read-modify-write and the
-- guards that keep bad input from being written (checked for the whole call
-- before any write: a refused call writes nothing).
-- KEYS     K bucket hashes {tokens, ts}, K in [1, 64]
-- ARGV     rule count R in [1, 64], R x (capacity, refill, period_ms, cost,
--          slack_ms), then, only when R > 1, K rule indices in [1, R]
-- returns  {allowed_1, retry_1, remaining_1, ..., allowed_K, retry_K,
--          remaining_K, now_ms}: what multi_rule answers as {allowed,
--          denied_by, retry_after_ms, remaining, replayed = 0, now_ms}, with
--          denied_by = 1 - allowed; retry -1 = can never succeed;
--          allowed -1 = the key holds another type (that call's error)
local count = #KEYS
local r = lh_int(ARGV[1], 1, 64)
if not r or count < 1 or count > 64 or #ARGV ~= 1 + 5 * r + (r > 1 and count or 0) then
  return lh_invalid('rules')
end
local rules = {}
for i = 1, r do
  local b = 2 + 5 * (i - 1)
  local capacity, refill, period = lh_rate(ARGV, b)
  if not capacity then return lh_invalid(refill) end
  local cost = lh_int(ARGV[b + 3], 1, LH_MAX)
  if not cost then return lh_invalid('cost') end
  local slack = lh_int(ARGV[b + 4], 0, LH_MAX)
  if not slack then return lh_invalid('slack_ms') end
  rules[i] = {capacity, refill, period, cost, math.ceil(capacity * period / refill), slack}
end
local which = nil
if r > 1 then
  which = {}
  for i = 1, count do
    which[i] = lh_int(ARGV[1 + 5 * r + i], 1, r)
    if not which[i] then return lh_invalid('rules') end
  end
end

local now = lh_now_ms()
-- One decision: multi_rule's refill and charge of one rule, inline. Returns
-- allowed, retry, remaining.
local function decide(key, rule)
  local capacity, refill, period, cost, full_ms = rule[1], rule[2], rule[3], rule[4], rule[5]
  -- pcall: a key of another type fails its own decision only (as a
  -- multi_decision sub-call would), not the decisions already written.
  local state = redis.pcall('HMGET', key, 'tokens', 'ts')
  if state.err then return -1, 0, 0 end
  local tokens, ts = tonumber(state[1]), tonumber(state[2])
  if tokens == nil or ts == nil then
    tokens, ts = capacity, now
  else
    local elapsed = now - ts
    if elapsed < 0 then elapsed = 0 elseif elapsed > full_ms then elapsed = full_ms end
    tokens = tokens + math.floor(elapsed * refill / period)
    if tokens > capacity then tokens = capacity end
    if now > ts then ts = now end
  end
  if cost > capacity then return 0, -1, tokens end
  if tokens < cost then return 0, math.ceil((cost - tokens) * period / refill), tokens end
  tokens = tokens - cost
  redis.call('HSET', key, 'tokens', lh_str(tokens), 'ts', lh_str(ts))
  redis.call('PEXPIRE', key, full_ms + rule[6])
  return 1, 0, tokens
end

local reply = {}
for i = 1, count do
  local o = 3 * i - 2
  reply[o], reply[o + 1], reply[o + 2] = decide(KEYS[i], rules[which and which[i] or 1])
end
reply[3 * count + 1] = now
return reply
