-- TICK_LOCK: elect the one process that ticks in this interval. The lock lapses after
-- one interval, so the next tick comes an interval later, run by whichever process
-- asks first (a ticker that died with its worker is replaced at the next interval).
--
-- KEYS[1] lock  KEYS[2] tick stats hash
-- ARGV[1] holder  ARGV[2] interval (ms)  ARGV[3] now (ms)
-- Returns: 0 if this holder ticks now, else the ms until the lock lapses.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('HINCRBY', KEYS[2], 'n', 1)
  redis.call('HSET', KEYS[2], 'last_ms', ARGV[3], 'by', ARGV[1])
  return 0
end
local left = redis.call('PTTL', KEYS[1])
if left < 0 then return tonumber(ARGV[2]) end
return left
