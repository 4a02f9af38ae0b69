-- TRACE: add lines to a run's trace (a list of its newest lines) and tell followers.
--
-- KEYS[1] run hash  KEYS[2] trace  KEYS[3] activity stream
-- ARGV[1] run id  ARGV[2] lines kept  ARGV[3...] lines
-- Returns: added, or gone (no run: nothing is written).
if redis.call('HEXISTS', KEYS[1], 'v') == 0 then return 'gone' end
redis.call('RPUSH', KEYS[2], unpack(ARGV, 3))
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[2]), -1)
redis.call('HINCRBY', KEYS[1], 'tn', #ARGV - 2)
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 10000, '*', 'r', ARGV[1])
return 'added'
