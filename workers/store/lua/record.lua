-- RECORD: put a call's outcome in the run's inbox, once, and release its lease.
--
-- The outcome is fenced: it is taken only from the attempt that claimed the call
-- last (`a:<call>` still holds its number), so a worker whose lease lapsed and whose
-- call another worker took over cannot record a second outcome. A tool's result
-- counts down the calls of its batch still out (`out`): only the last one needs the
-- run advanced now (the others leave a late advance in the outbox, just in case).
--
-- KEYS[1] run hash  KEYS[2] inbox  KEYS[3] outbox  KEYS[4] lease
-- ARGV[1] call  ARGV[2] event JSON  ARGV[3] the call's outbox member
-- ARGV[4] the run's advance member  ARGV[5] due (ms)  ARGV[6] token
-- ARGV[7] counted ("1" for a tool)  ARGV[8] attempt
-- Returns: advance (recorded; advance the run now), waiting (recorded; others of the
-- batch are out), duplicate (recorded before), fenced (another attempt took the
-- call over), or gone (no run).
if redis.call('HEXISTS', KEYS[1], 'v') == 0 then
  redis.call('ZREM', KEYS[3], ARGV[3])
  return 'gone'
end
if redis.call('GET', KEYS[4]) == ARGV[6] then redis.call('DEL', KEYS[4]) end
if redis.call('HEXISTS', KEYS[1], 'r:' .. ARGV[1]) == 1 then
  redis.call('ZREM', KEYS[3], ARGV[3])
  return 'duplicate'
end
if redis.call('HGET', KEYS[1], 'a:' .. ARGV[1]) ~= ARGV[8] then return 'fenced' end
redis.call('HSET', KEYS[1], 'r:' .. ARGV[1], 1)
redis.call('XADD', KEYS[2], '*', 'e', ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[3])
if ARGV[7] == '1' and redis.call('HINCRBY', KEYS[1], 'out', -1) > 0 then
  redis.call('ZADD', KEYS[3], 'NX', ARGV[5], ARGV[4])
  return 'waiting'
end
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[4])
return 'advance'
