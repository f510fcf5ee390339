-- look.lua: what a decision script would answer now, without writing: the
-- inner script's own body runs on a `redis` that reads but never writes
-- (script.rs wraps each lookable body into LH_LOOK with LH_READ_ONLY as its
-- `redis`), so a look decides exactly as a charge would, by construction.
-- Envoy's check-only hits (a descriptor's `hits_addend` of 0) on a TOML rule.
-- KEYS     the inner call's keys
-- ARGV     the inner script's name (token_bucket, multi_rule, gcra,
--          fixed_window, sliding_counter, sliding_log, chunk_spend,
--          share_gate), then the inner call's ARGV
-- returns  the inner call's reply, as if it had charged: nothing is written
--          (sliding_log's trim of entries already out of its window runs,
--          as on every call: it changes no count)
local run = LH_LOOK[ARGV[1]]
if not run then return lh_invalid('look') end
local args = {}
for i = 2, #ARGV do args[#args + 1] = ARGV[i] end
return run(KEYS, args)
