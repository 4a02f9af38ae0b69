-- READ_TRACE: a run's trace from a position on (positions count every line ever written).
--
-- KEYS[1] run hash  KEYS[2] trace
-- ARGV[1] position
-- Returns: {position after the last line, lines}.
local total = tonumber(redis.call('HGET', KEYS[1], 'tn') or '0')
local first = total - redis.call('LLEN', KEYS[2])
local from = math.max(0, tonumber(ARGV[1]) - first)
return {total, redis.call('LRANGE', KEYS[2], from, -1)}
