-- RELIST: put runs on the list their record says (running, waiting, done, failed,
-- cancelled, declined: engine.records.RunList) and off the others. The tick runs it
-- once over every run from before these lists existed; SAVE keeps them after that.
-- Atomic per run, so a SAVE that moves a run is either before it (and agrees) or after.
--
-- KEYS[1..n] the list indexes, in ARGV[1]'s order; then each run's hash
-- ARGV[1] JSON {"lists": [names in KEYS' order], "endings": {stop: list name}}
-- (a stop not named is "failed"); then for each run: its id, its score (created ms)
-- Returns how many runs were listed (those gone are skipped).
local how = cjson.decode(ARGV[1])
local n = #how.lists
local at = {}
for i, name in ipairs(how.lists) do at[name] = i end
local listed = 0
for k = n + 1, #KEYS do
  local id, score = ARGV[2 * (k - n)], ARGV[2 * (k - n) + 1]
  local meta = redis.call('HGET', KEYS[k], 'meta')
  local ok, record = false, nil
  if meta then ok, record = pcall(cjson.decode, meta) end
  if ok and type(record) == 'table' then
    local which = record.state or 'running'
    if which == 'finished' then
      local outcome = record.outcome
      local stop = type(outcome) == 'table' and outcome.stop or nil
      which = how.endings[stop] or 'failed'
    end
    local target = at[which] or at['failed']
    for i = 1, n do
      if i == target then
        redis.call('ZADD', KEYS[i], score, id)
      else
        redis.call('ZREM', KEYS[i], id)
      end
    end
    listed = listed + 1
  end
end
return listed
