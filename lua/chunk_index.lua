-- chunk_index.lua: the chunks a Region holds of a window pool, as its
-- syncer credited them, so every agent of the Region spends from all of
-- them (several agents per Region). One entry per chunk, named by its lease
-- id's two numbers ("<prefix_id>:<n>": the lease id is
-- "<region>.<prefix_id>:<n>"), value "granted_millitokens,expires_at_ms";
-- field '_t' holds the highest syncer token that wrote.
-- KEYS[1]  the index (hash)
-- ARGV     op 1 (add): token, prefix_id, n, granted_millitokens, expires_at_ms
--          op 2 (read)
--          op 3 (clear: the syncer was fenced, its chunks are void): token
-- returns  add:   {written, live entries, now_ms}; written = 0 when a higher
--                 token wrote (nothing written) or 64 chunks are live
--          read:  {count, then per live chunk, earliest expiry first:
--                  prefix_id, n, granted_millitokens, expires_at_ms; now_ms}
--          clear: {cleared, 0, now_ms}
-- Expired entries (now > expires_at_ms) are never read and are dropped by
-- the next add; the key expires with its last chunk.
local MAX_CHUNKS = 64
local op = lh_int(ARGV[1], 1, 3)
if not op then return lh_invalid('op') end
if #KEYS ~= 1 then return lh_invalid('keys') end
local now = lh_now_ms()
local entries, held = {}, nil
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do
  local field, value = flat[i], flat[i + 1]
  if field == '_t' then
    held = lh_int(value, 1, LH_MAX)
  else
    local p, n = string.match(field, '^(%d+):(%d+)$')
    local g, e = string.match(value, '^(%d+),(%d+)$')
    p, n = lh_int(p, 0, LH_MAX), lh_int(n, 0, LH_MAX)
    g, e = lh_int(g, 1, LH_MAX), lh_int(e, 0, 9007199254740991)
    if p and n and g and e then
      entries[#entries + 1] = {field = field, p = p, n = n, g = g, e = e}
    else
      entries[#entries + 1] = {field = field, e = -1}
    end
  end
end
if op == 2 then
  local live = {}
  for _, c in ipairs(entries) do
    if c.e >= now then live[#live + 1] = c end
  end
  table.sort(live, function(a, b)
    if a.e ~= b.e then return a.e < b.e end
    if a.p ~= b.p then return a.p < b.p end
    return a.n < b.n
  end)
  local out = {#live}
  for _, c in ipairs(live) do
    out[#out + 1] = c.p
    out[#out + 1] = c.n
    out[#out + 1] = c.g
    out[#out + 1] = c.e
  end
  out[#out + 1] = now
  return out
end
local token = lh_int(ARGV[2], 1, LH_MAX)
if not token then return lh_invalid('token') end
if held and held > token then return {0, held, now} end
if op == 3 then
  redis.call('DEL', KEYS[1])
  return {1, 0, now}
end
local p = lh_int(ARGV[3], 0, LH_MAX)
if not p then return lh_invalid('prefix_id') end
local n = lh_int(ARGV[4], 0, LH_MAX)
if not n then return lh_invalid('n') end
local g = lh_int(ARGV[5], 1, LH_MAX)
if not g then return lh_invalid('granted_millitokens') end
local e = lh_int(ARGV[6], 0, 9007199254740991)
if not e then return lh_invalid('expires_at_ms') end
local field = lh_str(p) .. ':' .. lh_str(n)
local live, last = 0, e
for _, c in ipairs(entries) do
  if c.e < now then
    redis.call('HDEL', KEYS[1], c.field)
  elseif c.field ~= field then
    live = live + 1
    last = math.max(last, c.e)
  end
end
if live >= MAX_CHUNKS or e < now then return {0, live, now} end
redis.call('HSET', KEYS[1], field, lh_str(g) .. ',' .. lh_str(e), '_t', lh_str(token))
redis.call('PEXPIREAT', KEYS[1], lh_str(last + 1 + LH_EXPIRY_SLACK_MS))
return {1, live + 1, now}
