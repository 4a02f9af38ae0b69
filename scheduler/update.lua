-- Replace a schedule's text if it is still what the caller read (pause, resume).
--
-- KEYS[1] schedules hash  KEYS[2] due index  KEYS[3] the schedule's history
-- ARGV[1] name  ARGV[2] the text as read  ARGV[3] the new text  ARGV[4] when it fires next
-- ARGV[5] history entry  ARGV[6] history kept
-- Returns 1 if replaced, 0 if the schedule changed (or went) since it was read.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
redis.call('LPUSH', KEYS[3], ARGV[5])
redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[6]) - 1)
return 1
