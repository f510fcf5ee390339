-- Measurement prototype, not used by the agent: K token-bucket decisions in one
-- call, the compact encoding with one MGET for every key of the call, then SET PX per key; rule parameters sent once per call.
-- No argument validation, no records: a lower bound on what the real
-- scripts cost in that encoding. Run by run.sh.
-- KEYS: K buckets. ARGV: rule count R, R x (capacity, refill, period_ms, slack_ms), then per key (rule index, cost).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local nr = tonumber(ARGV[1])
local rules = {}
for r = 1, nr do
  local b = 1 + (r-1)*4
  local capacity, refill, period, slack = tonumber(ARGV[b+1]), tonumber(ARGV[b+2]), tonumber(ARGV[b+3]), tonumber(ARGV[b+4])
  rules[r] = {capacity, refill, period, slack, math.ceil(capacity * period / refill)}
end
local base = 1 + nr*4
local out = {}
local o = 0
local set = 'SET'
local vals = redis.call('MGET', unpack(KEYS))
for i = 1, #KEYS do
  local rule = rules[tonumber(ARGV[base + 2*i - 1])]
  local cost = tonumber(ARGV[base + 2*i])
  local capacity, refill, period, full_ms = rule[1], rule[2], rule[3], rule[5]
  local v = vals[i]
  local tokens, ts = capacity, now
  if v then
    local a, c = string.match(v, '^(%d+):(%d+)$')
    tokens, ts = tonumber(a), tonumber(c)
    local elapsed = now - ts
    if elapsed < 0 then elapsed = 0 elseif elapsed > full_ms then elapsed = full_ms end
    tokens = math.min(capacity, tokens + math.floor(elapsed * refill / period))
    if now > ts then ts = now end
  end
  if tokens >= cost then
    tokens = tokens - cost
    redis.call(set, KEYS[i], tokens .. ':' .. ts, 'PX', full_ms + rule[4])
    out[o+1], out[o+2], out[o+3] = 1, tokens, 0
  else
    out[o+1], out[o+2], out[o+3] = 0, tokens, 1
  end
  o = o + 3
end
out[o+1] = now
return out
