-- TICK_LOCK: elect the one process that ticks in this interval. The lock lapses after
-- one interval, so the next tick comes an interval later, run by whichever process
-- asks first (a ticker that died with its worker is replaced at the next interval).
--
-- After a gap (no tick began for two intervals by Redis's own clock: Redis was away,
-- or the whole fleet was), the first asker does not tick yet: the lock is kept for
-- `settle` ms first. Every lease lapsed meanwhile, and a tick now would send again
-- the calls whose outcomes live workers still hold, unsaved (`runtime.leases
-- .save_holding`): their next attempts would fence those outcomes off. The holders,
-- retrying every second at most, save them within the settle time; the tick after
-- it sends the rest. (Redis's clock, not the askers': hosts' clocks may differ.)
--
-- KEYS[1] lock  KEYS[2] tick stats hash
-- ARGV[1] holder  ARGV[2] interval (ms)  ARGV[3] now (ms)  ARGV[4] settle (ms)
-- Returns: 0 if this holder ticks now, else the ms until the lock lapses.
local interval, settle = tonumber(ARGV[2]), tonumber(ARGV[4])
if redis.call('EXISTS', KEYS[1]) == 1 then
  local left = redis.call('PTTL', KEYS[1])
  if left < 0 then return interval end
  return left
end
local time = redis.call('TIME')
local clock = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local seen = tonumber(redis.call('HGET', KEYS[2], 'seen_ms'))
redis.call('HSET', KEYS[2], 'seen_ms', clock)
if seen and clock - seen > 2 * interval and settle > 0 then
  redis.call('SET', KEYS[1], '(settling after a gap)', 'PX', settle)
  -- Seen as of the settle's end: its own wait is no gap (a settle longer than two
  -- intervals would otherwise be followed by another, for ever).
  redis.call('HSET', KEYS[2], 'seen_ms', clock + settle)
  return settle
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', interval)
redis.call('HINCRBY', KEYS[2], 'n', 1)
redis.call('HSET', KEYS[2], 'last_ms', ARGV[3], 'by', ARGV[1])
return 0
