-- Claim one slot of a schedule, exactly once however many ticks try (see scheduler.store).
--
-- KEYS[1] schedules hash   KEYS[2] due index   KEYS[3] the slot's key
-- KEYS[4] notifications    KEYS[5] firing set  KEYS[6] the schedule's history
-- KEYS[7] the schedule's queue   KEYS[8] queued index   KEYS[9] the schedule's recent runs
-- ARGV[1] name  ARGV[2] the schedule's stored text as the tick read it
-- ARGV[3] the schedule with its new last run  ARGV[4] when it fires next
-- ARGV[5] slot key TTL (ms)  ARGV[6] notification JSON ('' for none)
-- ARGV[7] notifications kept  ARGV[8] firing member ('' when no run starts)  ARGV[9] now (ms)
-- ARGV[10] history entry  ARGV[11] history kept  ARGV[12] queue member ('' for none)
-- ARGV[13] its score  ARGV[14] the run it starts  ARGV[15] recent runs kept
-- Returns: claimed, changed (the schedule was replaced, removed or advanced since it
-- was read), or taken (another tick has this slot).
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 'changed' end
if not redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[5]) then return 'taken' end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
if ARGV[6] ~= '' then
  redis.call('LPUSH', KEYS[4], ARGV[6])
  redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[7]) - 1)
end
if ARGV[8] ~= '' then
  redis.call('ZADD', KEYS[5], ARGV[9], ARGV[8])
  redis.call('ZADD', KEYS[9], ARGV[9], ARGV[14])
  redis.call('ZREMRANGEBYRANK', KEYS[9], 0, -tonumber(ARGV[15]) - 1)
end
redis.call('LPUSH', KEYS[6], ARGV[10])
redis.call('LTRIM', KEYS[6], 0, tonumber(ARGV[11]) - 1)
if ARGV[12] ~= '' then
  redis.call('ZADD', KEYS[7], ARGV[13], ARGV[12])
  redis.call('ZADD', KEYS[8], 'LT', ARGV[13], ARGV[1])
end
return 'claimed'
