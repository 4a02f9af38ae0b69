-- SAVE_CLAIM: SAVE a step and, once it is saved, CLAIM the one call it decided, in one
-- round trip, for a worker that continues that call in place (workers.runtime.continuation).
--
-- Both scripts run whole and unchanged: `workers.store.scripts.lua` puts each in for
-- its `--#` line below, as a function of its own KEYS and ARGV. The claim sees the run
-- as the save left it, exactly as a CLAIM sent right after would; a save that did not
-- land (stale, duplicate, fenced) claims nothing.
--
-- KEYS[1..k] SAVE's keys (k: 9 on a cluster, 1 on a single Redis, where the scripts
-- spell the others), then those of CLAIM's that SAVE does not have
-- ARGV[1] "k n": the number of SAVE's keys and of its arguments  ARGV[2] where each of
-- CLAIM's keys is in KEYS (its positions, space-separated)  ARGV[3..2+n] SAVE's
-- arguments  ARGV[3+n..] CLAIM's
-- Returns: {SAVE's answer} when it did not save, else {'saved', CLAIM's answer}.
--# save
--# claim
local k, n = string.match(ARGV[1], '^(%d+) (%d+)$')
k, n = tonumber(k), tonumber(n)
local save_keys, save_args, claim_keys, claim_args = {}, {}, {}, {}
for i = 1, k do save_keys[i] = KEYS[i] end
for at in string.gmatch(ARGV[2], '%d+') do claim_keys[#claim_keys + 1] = KEYS[tonumber(at)] end
for i = 1, n do save_args[i] = ARGV[2 + i] end
for i = n + 3, #ARGV do claim_args[i - n - 2] = ARGV[i] end
local saved = save(save_keys, save_args)
if type(saved) == 'table' then return saved end  -- (SAVE's error reply: raised as it is)
if saved ~= 'saved' then return {saved} end
local claimed = claim(claim_keys, claim_args)
if claimed.err then return claimed end  -- (CLAIM's error reply: raised, not nested)
return {saved, claimed}
