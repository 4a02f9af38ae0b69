-- DECIDE: a person's decision (or the tick's expiry) for something pending; used once.
--
-- A decision that comes after the entry's expiry (its score in the pending index)
-- is refused, and the expiry's own event (a decline, "no answer came in time") is
-- applied in its place: a late yes never runs a call, whether or not a tick ran.
-- "After" is by Redis's own clock (TIME), never the caller's: a decider whose clock
-- is behind cannot get a late yes in.
--
-- KEYS[1] run hash  KEYS[2] inbox  KEYS[3] outbox  KEYS[4] pending index
-- KEYS[5] pending data
-- ARGV[1] pending member  ARGV[2] decision field  ARGV[3] event JSON
-- ARGV[4] advance member  ARGV[5] due (ms)  ARGV[6] expiry event JSON
-- Returns: applied, expired (too late: the expiry was applied, now or before),
-- decided (decided already), not_pending, or gone (no run).
if redis.call('HEXISTS', KEYS[1], 'v') == 0 then return 'gone' end
local before = redis.call('HGET', KEYS[1], ARGV[2])
if before == 'expired' then return 'expired' end
if before then return 'decided' end
if redis.call('HEXISTS', KEYS[5], ARGV[1]) == 0 then return 'not_pending' end
local expires = tonumber(redis.call('ZSCORE', KEYS[4], ARGV[1]) or '0')
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local outcome, event = 'applied', ARGV[3]
if expires > 0 and expires <= now then outcome, event = 'expired', ARGV[6] end
redis.call('HSET', KEYS[1], ARGV[2], outcome == 'expired' and 'expired' or 'decided')
redis.call('XADD', KEYS[2], '*', 'e', event)
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[4])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
return outcome
