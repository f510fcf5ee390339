-- multi_decision.lua: up to 64 independent calls of the other scripts in one
-- EVALSHA, to pay the per-call script overhead once (ARCHITECTURE §3.3).
-- Batching never merges decisions: each sub-call runs its own script body
-- (the same file, wrapped as a function of (KEYS, ARGV) by script.rs into
-- LH_SCRIPTS), in order, so a later sub-call sees an earlier one's writes;
-- each is all-or-nothing across its own rules and keeps its own idempotency
-- record. A sub-call's error (returned or raised) is its own reply only.
-- TIME is read once per call (script.rs shadows lh_now_ms): every sub-call
-- decides, and returns, the same now_ms.
-- KEYS     the sub-calls' keys, concatenated in order; in a Redis Cluster all
--          of one hash tag (the caller's duty, as for any script)
-- ARGV     count K in [1, 64], then per sub-call: script name, key count,
--          argument count, its arguments
-- returns  K replies in order: each the sub-call's own reply (its integer
--          array ending with now_ms) or its error reply
-- A malformed envelope runs nothing: 'calls invalid'.
local LH_MULTI_MAX = 64
local count = lh_int(ARGV[1], 1, LH_MULTI_MAX)
if not count then return lh_invalid('calls') end
local calls = {}
local k, a = 1, 2
for i = 1, count do
  local run = LH_SCRIPTS[ARGV[a]]
  local nkeys = lh_int(ARGV[a + 1], 0, #KEYS)
  local nargs = lh_int(ARGV[a + 2], 0, #ARGV)
  if not run or not nkeys or not nargs then return lh_invalid('calls') end
  a = a + 3
  if k + nkeys - 1 > #KEYS or a + nargs - 1 > #ARGV then return lh_invalid('calls') end
  local keys, args = {}, {}
  for j = 1, nkeys do keys[j] = KEYS[k + j - 1] end
  for j = 1, nargs do args[j] = ARGV[a + j - 1] end
  k, a = k + nkeys, a + nargs
  calls[i] = {run, keys, args}
end
if k ~= #KEYS + 1 or a ~= #ARGV + 1 then return lh_invalid('calls') end

local replies = {}
for i = 1, count do
  -- pcall: a raised error (a redis.call refused, a Lua fault) ends this
  -- sub-call only; like a lone script, what it wrote before stays.
  local ok, reply = pcall(calls[i][1], calls[i][2], calls[i][3])
  if not ok then
    if type(reply) == 'table' and reply.err then
      reply = redis.error_reply(reply.err)
    else
      reply = redis.error_reply('ERR ' .. tostring(reply))
    end
  end
  replies[i] = reply
end
return replies
