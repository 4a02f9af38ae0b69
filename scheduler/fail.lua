-- A firing's run could not start: its history entry says so (see ScheduleStore.failed).
--
-- KEYS[1] the schedule's history  KEYS[2] the schedule's recent runs  KEYS[3] firing set
-- ARGV[1] the run that did not start  ARGV[2] the failed entry  ARGV[3] history kept
-- ARGV[4] the firing member
-- The `fired` entry of that run becomes ARGV[2] in place, so the history tells the firing
-- once, as failed. No entry (the schedule was removed since) writes none: a history
-- pushed here would outlive its schedule. The run is no longer one the schedule started
-- (its overlap policy would wait on it), nor a firing a later tick should start.
-- Returns 1 if the entry was replaced, else 0.
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[4])
local entries = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[3]) - 1)
for index, text in ipairs(entries) do
  local ok, entry = pcall(cjson.decode, text)
  if ok and type(entry) == 'table' and entry['kind'] == 'fired' and entry['run_id'] == ARGV[1] then
    redis.call('LSET', KEYS[1], index - 1, ARGV[2])
    return 1
  end
end
return 0
