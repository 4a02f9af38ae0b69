-- Claim one slot of a schedule, exactly once however many ticks try (see scheduler.store).
--
-- KEYS[1] schedules hash   KEYS[2] due index   KEYS[3] the slot's key
-- KEYS[4] notifications    KEYS[5] firing set
-- ARGV[1] name  ARGV[2] the schedule's stored text as the tick read it
-- ARGV[3] the schedule with its new last run  ARGV[4] its next due time
-- ARGV[5] slot key TTL (ms)  ARGV[6] notification JSON ('' for a run schedule)
-- ARGV[7] notifications kept  ARGV[8] firing member  ARGV[9] now (ms)
-- Returns: claimed, changed (the schedule was replaced, removed or advanced since it
-- was read), or taken (another tick has this slot).
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 'changed' end
if not redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[5]) then return 'taken' end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
if ARGV[6] ~= '' then
  redis.call('LPUSH', KEYS[4], ARGV[6])
  redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[7]) - 1)
else
  redis.call('ZADD', KEYS[5], ARGV[9], ARGV[8])
end
return 'claimed'
