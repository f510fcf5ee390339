-- multi_rule.lua: up to 8 token buckets in one hash slot. The n enforcing
-- buckets are charged all or none; the m shadow buckets after them are each
-- charged on their own and never refuse. Optional idempotency record per
-- decision id, bound to a digest of the enforcing charges. A denial writes
-- no enforcing bucket; a replay or a refused reuse writes nothing at all,
-- shadow buckets included (a retry never counts twice).
-- KEYS[1]         decision record (see below)
-- KEYS[2..n+1]    enforcing bucket hashes {tokens, ts}
-- KEYS[n+2..n+m+1] shadow bucket hashes; all distinct, one hash tag (the caller's duty)
-- ARGV            slack_ms, decision_ttl_ms (0 = no record), request_digest (32 lowercase
--                 hex: the caller's digest of the enforcing bucket keys and costs),
--                 shadow_count m, then per bucket (enforcing, then shadow):
--                 capacity, refill, period_ms, cost (millitokens / ms)
-- returns         {allowed, denied_by, retry_after_ms, remaining_1 .. remaining_n,
--                  shadow_1 .. shadow_m, replayed, now_ms}
--                 denied_by = first denying rule (1-based, 0 = none); retry -1 = can never
--                 succeed; shadow_i = 1 charged, 0 would have refused, -1 not evaluated
--                 (a replay); replayed = 1 when answered from the record
-- Record: "digest:allowed,denied_by,retry,remaining_1,..,remaining_n". A record
-- under another digest (the id reused for other principals, rules or costs) is
-- refused: "request_id refused: reused", nothing read or written. A record
-- without "digest:" predates digests (written by the version before them): it
-- is trusted for its TTL and replayed, unless its length shows another rule
-- count (then it is another request: refused as reused).
local total = #KEYS - 1
local m = lh_int(ARGV[4], 0, 7)
if not m or total - m < 1 or total > 8 or #ARGV ~= 4 + 4 * total then
  return lh_invalid('rules')
end
local n = total - m
-- Any key twice (a bucket, or the record on a bucket) would read stale state
-- and overwrite a write: refuse it.
for i = 1, total + 1 do
  for j = i + 1, total + 1 do
    if KEYS[i] == KEYS[j] then return lh_invalid('keys') end
  end
end
local slack = lh_int(ARGV[1], 0, LH_MAX)
if not slack then return lh_invalid('slack_ms') end
local dec_ttl = lh_int(ARGV[2], 0, LH_MAX)
if not dec_ttl then return lh_invalid('decision_ttl_ms') end
local digest = ARGV[3]
if #digest ~= 32 or not string.find(digest, '^[0-9a-f]+$') then
  return lh_invalid('request_digest')
end
local rules = {}
for i = 1, total do
  local b = 5 + 4 * (i - 1)
  local capacity, refill, period = lh_rate(ARGV, b)
  if not capacity then return lh_invalid(refill) end
  local cost = lh_int(ARGV[b + 3], 1, LH_MAX)
  if not cost then return lh_invalid('cost') end
  rules[i] = {capacity = capacity, refill = refill, period = period, cost = cost}
end

local now = lh_now_ms()
if dec_ttl > 0 then
  local prior = redis.call('GET', KEYS[1])
  if prior then
    -- Replay: the stored decision, today's clock, nothing touched; only
    -- for the request it was recorded for.
    local stored, body = string.match(prior, '^([0-9a-f]+):(.*)$')
    if stored then
      if #stored ~= 32 then return lh_invalid('decision_record') end
      if stored ~= digest then return lh_refused('request_id', 'reused') end
    elseif string.find(prior, ':', 1, true) then
      return lh_invalid('decision_record')
    else
      body = prior
    end
    local reply = {}
    for piece in string.gmatch(body .. ',', '([^,]*),') do
      local v = nil
      if #piece <= 17 and string.match(piece, '^%-?%d+$') then v = tonumber(piece) end
      if v == nil or math.abs(v) > LH_MAX_PRODUCT then return lh_invalid('decision_record') end
      reply[#reply + 1] = v
    end
    if #reply ~= 3 + n then
      if not stored and #reply >= 4 then return lh_refused('request_id', 'reused') end
      return lh_invalid('decision_record')
    end
    for _ = 1, m do reply[#reply + 1] = -1 end
    reply[#reply + 1] = 1
    reply[#reply + 1] = now
    return reply
  end
end

local denied_by, retry = 0, 0
for i = 1, n do
  local r = rules[i]
  local full_ms
  r.tokens, r.ts, full_ms = lh_bucket(KEYS[i + 1], r.capacity, r.refill, r.period, now)
  r.ttl = full_ms + slack
  local wait = nil
  if r.cost > r.capacity then
    wait = -1
  elseif r.tokens < r.cost then
    wait = math.ceil((r.cost - r.tokens) * r.period / r.refill)
  end
  if wait then
    if denied_by == 0 then denied_by = i end
    if wait == -1 or retry == -1 then retry = -1 else retry = math.max(retry, wait) end
  end
end

local reply = {0, denied_by, retry}
if denied_by == 0 then
  reply[1] = 1
  for i = 1, n do
    local r = rules[i]
    r.tokens = r.tokens - r.cost
    redis.call('HSET', KEYS[i + 1], 'tokens', lh_str(r.tokens), 'ts', lh_str(r.ts))
    redis.call('PEXPIRE', KEYS[i + 1], r.ttl)
  end
end
for i = 1, n do
  reply[3 + i] = rules[i].tokens
end
if dec_ttl > 0 then
  local text = {}
  for i = 1, #reply do text[i] = lh_str(reply[i]) end
  redis.call('SET', KEYS[1], digest .. ':' .. table.concat(text, ','), 'PX', dec_ttl)
end
-- Shadow buckets: each decides alone, whatever the enforcing outcome, and
-- is charged only when it holds its cost.
for i = n + 1, total do
  local r = rules[i]
  local tokens, ts, full_ms = lh_bucket(KEYS[i + 1], r.capacity, r.refill, r.period, now)
  if r.cost <= r.capacity and tokens >= r.cost then
    redis.call('HSET', KEYS[i + 1], 'tokens', lh_str(tokens - r.cost), 'ts', lh_str(ts))
    redis.call('PEXPIRE', KEYS[i + 1], full_ms + slack)
    reply[#reply + 1] = 1
  else
    reply[#reply + 1] = 0
  end
end
reply[#reply + 1] = 0
reply[#reply + 1] = now
return reply
