-- UNCLAIM: give a claim back (its call never started): the attempt is not counted,
-- the lease is released, and the call's message is due again. Only while no later
-- attempt claimed the call (its lease may have lapsed meanwhile).
--
-- KEYS[1] run hash  KEYS[2] lease  KEYS[3] outbox
-- ARGV[1] call  ARGV[2] attempt ('0': the one whose lease holds this token, for a claim
-- whose answer was lost)  ARGV[3] token  ARGV[4] outbox member  ARGV[5] due (ms)
-- Returns: given_back, or not_ours.
if ARGV[2] == '0' then
  if redis.call('GET', KEYS[2]) ~= ARGV[3] then return 'not_ours' end
elseif redis.call('HGET', KEYS[1], 'a:' .. ARGV[1]) ~= ARGV[2] then
  return 'not_ours'
end
if redis.call('HINCRBY', KEYS[1], 'a:' .. ARGV[1], -1) <= 0 then
  redis.call('HDEL', KEYS[1], 'a:' .. ARGV[1])
end
if redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[4])
return 'given_back'
