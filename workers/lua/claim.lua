-- CLAIM: take the right to make a call (a model call or a tool call): its lease.
--
-- A call is claimed only if the run's record says it is due: a tool call must be
-- `running` in the record's calls (approved, if it needed a person), a model call
-- must be the one the record asked for at its current step, and the run must not
-- be finished. Whatever message arrives (forged, replayed, early, another run's),
-- nothing runs that the record did not decide. A claim counts the attempt (the
-- fence that RECORD and SAVE check) and hands back what the call and the save
-- after it need, so neither reads the run again.
--
-- KEYS[1] run hash  KEYS[2] the call's lease  KEYS[3] outbox  KEYS[4] root's hash
-- KEYS[5] inbox
-- ARGV[1] the call ("call-2", or "m<seq>")  ARGV[2] "tool" or "model"
-- ARGV[3] seq (model calls)  ARGV[4] token  ARGV[5] lease (ms)  ARGV[6] outbox member
-- ARGV[7] lease deadline (ms)
-- Returns: {status, attempts, root tokens, root budget or -1, version, record, snapshot,
-- inbox}; status is claimed, gone (no run), done (outcome recorded), refused (the
-- record does not call for it) or busy (another worker holds the lease).
local function answer(status) return {status, 0, 0, -1, '', '', '', {}} end
local run = redis.call('HMGET', KEYS[1], 'v', 'meta', 'snap')
if not run[1] then return answer('gone') end
if redis.call('HEXISTS', KEYS[1], 'r:' .. ARGV[1]) == 1 then return answer('done') end
local ok, record = pcall(cjson.decode, run[2] or '')
if not ok or type(record) ~= 'table' or record.state == 'finished' then
  return answer('refused')
end
if ARGV[2] == 'tool' then
  local calls = record.calls
  local track = type(calls) == 'table' and calls[ARGV[1]] or nil
  if type(track) ~= 'table' or track.status ~= 'running' then return answer('refused') end
elseif record.asked ~= tonumber(ARGV[3]) or (record.seq or 0) ~= tonumber(ARGV[3]) then
  return answer('refused')  -- not the model call the run waits on at this step
end
if redis.call('EXISTS', KEYS[2]) == 1 then return answer('busy') end
local attempts = redis.call('HINCRBY', KEYS[1], 'a:' .. ARGV[1], 1)
redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[7], ARGV[6])
local total = tonumber(redis.call('HGET', KEYS[4], 'tt') or '0')
local budget = tonumber(redis.call('HGET', KEYS[4], 'budget') or '-1')
local inbox = redis.call('XRANGE', KEYS[5], '-', '+', 'COUNT', 1000)
return {'claimed', attempts, total, budget, run[1], run[2], run[3], inbox}
