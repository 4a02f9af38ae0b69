-- REPLY: put a person's follow-up (a new turn) in a root run's inbox, deciding by its
-- strategy what happens while the run is still working.
--
-- A run counts as working when its record is not finished, or when another
-- follow-up is on its way (`fu`, cleared by the SAVE that applies it): `reject`
-- refuses then; `enqueue` and `interrupt` go in, and the engine applies them (the
-- turn after this one, or this turn stopped and the new one begun).
--
-- KEYS[1] run hash  KEYS[2] inbox  KEYS[3] outbox
-- ARGV[1] the follow-up event JSON  ARGV[2] strategy  ARGV[3] the run's advance member
-- ARGV[4] when to send it again (ms)
-- Returns: sent, busy (reject, and the run works), specialist (not a root run),
-- corrupt (its record cannot be read), or gone (no run).
local meta = redis.call('HGET', KEYS[1], 'meta')
if not meta or redis.call('HEXISTS', KEYS[1], 'v') == 0 then return 'gone' end
local ok, record = pcall(cjson.decode, meta)
if not ok or type(record) ~= 'table' then return 'corrupt' end
-- (Who its parent is never changes: it is with the fixed fields, if they are apart.)
local fixed = redis.call('HGET', KEYS[1], 'fixed')
if fixed then ok, record.parent = pcall(function() return cjson.decode(fixed).parent end) end
if not ok then return 'corrupt' end
if record.parent ~= nil and record.parent ~= cjson.null then return 'specialist' end
local working = record.state ~= 'finished' or redis.call('HEXISTS', KEYS[1], 'fu') == 1
if working and ARGV[2] == 'reject' then return 'busy' end
redis.call('HSET', KEYS[1], 'fu', 1)
redis.call('XADD', KEYS[2], '*', 'e', ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
return 'sent'
