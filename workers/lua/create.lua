-- CREATE: make a run, unless one with that id exists (a retried start is one run).
--
-- KEYS[1] run hash  KEYS[2] runs index  KEYS[3] outbox
-- ARGV[1] run id  ARGV[2] record JSON  ARGV[3] snapshot  ARGV[4] created (ms)
-- ARGV[5] its advance member  ARGV[6] when to send it again (ms)  ARGV[7] budget or ''
-- Returns: created, or exists.
if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
redis.call('HSET', KEYS[1], 'v', 1, 'meta', ARGV[2], 'snap', ARGV[3], 'tp', 0, 'tc', 0, 'tt', 0)
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'budget', ARGV[7]) end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[5])
return 'created'
