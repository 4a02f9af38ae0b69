-- Take one queued firing of a schedule (run now, backfill, buffered), exactly once.
--
-- KEYS[1] the schedule's queue  KEYS[2] queued index  KEYS[3] firing set
-- KEYS[4] the schedule's history  KEYS[5] the schedule's recent runs
-- ARGV[1] queue member  ARGV[2] name  ARGV[3] firing member ('' when no run starts)
-- ARGV[4] now (ms)  ARGV[5] history entry  ARGV[6] history kept  ARGV[7] the run it starts
-- ARGV[8] recent runs kept
-- Returns: taken (by this caller), or gone (another tick took it, or the schedule went).
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 'gone' end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if first[1] then
  redis.call('ZADD', KEYS[2], first[2], ARGV[2])
else
  redis.call('ZREM', KEYS[2], ARGV[2])
end
if ARGV[3] ~= '' then
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
  redis.call('ZADD', KEYS[5], ARGV[4], ARGV[7])
  redis.call('ZREMRANGEBYRANK', KEYS[5], 0, -tonumber(ARGV[8]) - 1)
end
redis.call('LPUSH', KEYS[4], ARGV[5])
redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[6]) - 1)
return 'taken'
