-- multi_rule.lua: up to 8 token buckets in one hash slot, charged all or none;
-- optional idempotency record per decision id, bound to a digest of the
-- request. A denial writes no bucket.
-- KEYS[1]       decision record: string "digest:allowed,denied_by,retry,remaining_1,..,remaining_n"
-- KEYS[2..n+1]  bucket hashes {tokens, ts}: distinct, one hash tag (the caller's duty)
-- ARGV          slack_ms, decision_ttl_ms (0 = no record), request_digest (32 lowercase
--               hex: the caller's digest of the bucket keys and costs), then per bucket:
--               capacity, refill, period_ms, cost (millitokens / ms)
-- returns       {allowed, denied_by, retry_after_ms, remaining_1 .. remaining_n, now_ms}
--               denied_by = first denying rule (1-based, 0 = none); retry -1 = can never succeed
-- A record under another digest (the id reused for other principals, rules or
-- costs) is refused: "request_id refused: reused", nothing read or written.
local n = #KEYS - 1
if n < 1 or n > 8 or #ARGV ~= 3 + 4 * n then return lh_invalid('rules') end
-- Any key twice (a bucket, or the record on a bucket) would read stale state
-- and overwrite a write: refuse it.
for i = 1, n + 1 do
  for j = i + 1, n + 1 do
    if KEYS[i] == KEYS[j] then return lh_invalid('keys') end
  end
end
local slack = lh_int(ARGV[1], 0, LH_MAX)
if not slack then return lh_invalid('slack_ms') end
local dec_ttl = lh_int(ARGV[2], 0, LH_MAX)
if not dec_ttl then return lh_invalid('decision_ttl_ms') end
local digest = ARGV[3]
if #digest ~= 32 or not string.match(digest, '^[0-9a-f]+$') then
  return lh_invalid('request_digest')
end
local rules = {}
for i = 1, n do
  local b = 4 + 4 * (i - 1)
  local capacity, refill, period = lh_rate(b)
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
    if not stored or #stored ~= 32 then return lh_invalid('decision_record') end
    if stored ~= digest then return lh_refused('request_id', 'reused') end
    local reply = {}
    for piece in string.gmatch(body .. ',', '([^,]*),') do
      local v = nil
      if #piece <= 17 and string.match(piece, '^%-?%d+$') then v = tonumber(piece) end
      if v == nil or math.abs(v) > LH_MAX_PRODUCT then return lh_invalid('decision_record') end
      reply[#reply + 1] = v
    end
    if #reply ~= 3 + n then return lh_invalid('decision_record') end
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
reply[#reply + 1] = now
return reply
