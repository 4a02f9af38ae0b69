-- CREATE: make a run, unless one with that id exists (a retried start is one run).
--
-- A root's budget becomes its tree's limits (`lt` tokens, `lu` micro-dollars, `lc`
-- model calls, `ld` the deadline in ms), which admission (CLAIM) checks and
-- `relay.extend` (EXTEND) raises; a deadline also goes into the deadlines index.
--
-- The agent's snapshot is stored apart (form 2, which a head says): its head and its start (what the start
-- set, never changed after) in the hash, its history entries (if it has any yet) in the
-- run's history list.
--
-- The run's journal begins with its start (its record and whole snapshot, which later
-- saves do not replace). A fork's stubbed outcomes go into its hash (`s:<digest>`).
--
-- KEYS[1] run hash  KEYS[2] runs index  KEYS[3] outbox  KEYS[4] deadlines index
-- KEYS[5] history list  KEYS[6] the runs index of its list (runs:running)
-- KEYS[7] journal list
-- ARGV[1] run id  ARGV[2] record JSON (the fields a step changes)  ARGV[3] snapshot head
-- ARGV[4] created (ms)
-- ARGV[5] its advance member  ARGV[6] when to send it again (ms)
-- ARGV[7..10] the tokens, micro-dollar, model-call and deadline limits, or ''
-- ARGV[11] the journal's start  ARGV[12] stubbed outcomes: a JSON object field -> output, or ''
-- ARGV[13] the record's fixed fields (JSON)  ARGV[14] the agent's start (JSON)
-- ARGV[15..] the history entries
-- Returns: created, or exists.
if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
redis.call('HSET', KEYS[1], 'v', 1, 'meta', ARGV[2], 'fixed', ARGV[13], 'head', ARGV[3])
-- (A start of nothing but the record's task is no field: ~50 bytes of a parked run.)
if ARGV[14] ~= '{}' then redis.call('HSET', KEYS[1], 'start', ARGV[14]) end
redis.call('DEL', KEYS[5])
redis.call('DEL', KEYS[7])
redis.call('RPUSH', KEYS[7], ARGV[11])
if ARGV[12] ~= '' then
  for field, output in pairs(cjson.decode(ARGV[12])) do redis.call('HSET', KEYS[1], field, output) end
end
for i = 15, #ARGV, 1000 do
  redis.call('RPUSH', KEYS[5], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
local limits = {'lt', 'lu', 'lc', 'ld'}
for i, field in ipairs(limits) do
  if ARGV[6 + i] ~= '' then redis.call('HSET', KEYS[1], field, ARGV[6 + i]) end
end
if ARGV[10] ~= '' then redis.call('ZADD', KEYS[4], ARGV[10], ARGV[1]) end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
redis.call('ZADD', KEYS[6], ARGV[4], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[5])
return 'created'
