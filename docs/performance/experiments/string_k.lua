-- Measurement prototype, not used by the agent: K token-bucket decisions in one
-- call, token buckets stored as one string 'tokens:ts': GET, SET PX per key (the compact encoding).
-- No argument validation, no records: a lower bound on what the real
-- scripts cost in that encoding. Run by run.sh.
-- KEYS: K buckets. ARGV: per key capacity, refill, period_ms, cost, slack_ms.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for i = 1, #KEYS do
  local b = (i-1)*5
  local capacity, refill, period, cost, slack = tonumber(ARGV[b+1]), tonumber(ARGV[b+2]), tonumber(ARGV[b+3]), tonumber(ARGV[b+4]), tonumber(ARGV[b+5])
  local full_ms = math.ceil(capacity * period / refill)
  local v = redis.call('GET', KEYS[i]); local state = {}; if v then local a, c = string.match(v, '^(%d+):(%d+)$'); state = {a, c} end
  local tokens, ts = tonumber(state[1]), tonumber(state[2])
  if tokens == nil then tokens, ts = capacity, now else
    local elapsed = math.min(math.max(0, now - ts), full_ms)
    tokens = math.min(capacity, tokens + math.floor(elapsed * refill / period)); ts = math.max(ts, now) end
  if tokens >= cost then tokens = tokens - cost
    redis.call('SET', KEYS[i], string.format('%d:%d', tokens, ts), 'PX', full_ms + slack)
    out[i] = {1, tokens, 0} else out[i] = {0, tokens, 1} end
end
out[#out+1] = now
return out
