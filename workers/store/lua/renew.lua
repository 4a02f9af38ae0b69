-- RENEW: keep a call's lease while it runs. A lease that lapsed (the worker was too
-- busy to renew in time) is taken back if no other attempt claimed the call since.
-- A call whose attempt marker is gone (a person's `interrupt` stopped its turn) has
-- lost it: the worker is told to stop it, and its outcome would be fenced off.
--
-- KEYS[1] lease  KEYS[2] outbox  KEYS[3] run hash
-- ARGV[1] token  ARGV[2] lease (ms)  ARGV[3] outbox member  ARGV[4] deadline (ms)
-- ARGV[5] call  ARGV[6] attempt
-- Returns: kept; cancelled (kept, but the run was cancelled: the holder stops the
-- call); or lost (another attempt took the call over, its outcome is in, or its turn
-- was stopped).
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] and redis.call('HGET', KEYS[3], 'a:' .. ARGV[5]) ~= ARGV[6] then
  redis.call('DEL', KEYS[1])
  return 'lost'
elseif holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif holder == false and redis.call('HGET', KEYS[3], 'a:' .. ARGV[5]) == ARGV[6]
    and redis.call('HEXISTS', KEYS[3], 'r:' .. ARGV[5]) == 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else
  return 'lost'
end
redis.call('ZADD', KEYS[2], 'XX', ARGV[4], ARGV[3])
if redis.call('HEXISTS', KEYS[3], 'cancel') == 1 then
  return 'cancelled'
end
return 'kept'
