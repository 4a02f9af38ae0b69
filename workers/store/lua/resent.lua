-- RESENT: say in a run's trace that one of its calls is sent again because the attempt
-- that had it was lost (its lease lapsed with no outcome recorded): once per attempt.
--
-- Said by the tick as it sends the call again, or by the worker that claimed the next
-- attempt (if the tick did not say it first: the lease lapsed after it looked).
-- Nothing is written if this attempt was noted already (`n:<call>`: the attempt last
-- noted), or (from the tick) if the call was never claimed, has an outcome, is held by
-- a live lease or was claimed again since, or (from the worker) if the call's claims
-- are not the lost one's and its own. A call sent again before any worker took it (a
-- lost message, a full queue) is no attempt lost, and is not noted.
--
-- KEYS[1] run hash  KEYS[2] trace  KEYS[3] activity stream  KEYS[4] the call's lease
-- ARGV[1] run id  ARGV[2] call  ARGV[3] the attempt lost  ARGV[4] lines kept
-- ARGV[5] the trace line  ARGV[6] 1 from the worker that took the next attempt
-- Returns 1 if it was noted, else 0.
if redis.call('HEXISTS', KEYS[1], 'v') == 0 then return 0 end
local attempts = tonumber(redis.call('HGET', KEYS[1], 'a:' .. ARGV[2]) or '0')
local lost = tonumber(ARGV[3])
if ARGV[6] == '1' then
  if attempts ~= lost + 1 then return 0 end
elseif attempts ~= lost or redis.call('HEXISTS', KEYS[1], 'r:' .. ARGV[2]) == 1
    or redis.call('EXISTS', KEYS[4]) == 1 then
  return 0
end
if redis.call('HGET', KEYS[1], 'n:' .. ARGV[2]) == ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], 'n:' .. ARGV[2], ARGV[3])
redis.call('RPUSH', KEYS[2], ARGV[5])
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[4]), -1)
redis.call('HINCRBY', KEYS[1], 'tn', 1)
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 10000, '*', 'r', ARGV[1])
return 1
