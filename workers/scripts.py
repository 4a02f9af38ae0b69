"""The Lua scripts that make each multi-key change to Redis atomic.

Each script is one transition of the run store; `workers.store` is their only
caller. Runs live in one hash each (`v` version, `meta` record, `snap` agent
snapshot, plus small fields: `r:<x>` result recorded, `a:<x>` claim attempts,
`d:<x>` decision made, `tp`/`tc`/`tt` token totals, `tn` trace lines ever
written, `out` calls of the batch still out, `budget`, `cancel`). A run's trace
is a list of its newest lines; the activity stream names runs whose trace grew.
"""

from __future__ import annotations

__all__ = [
    "CLAIM",
    "CREATE",
    "DECIDE",
    "READ_TRACE",
    "RECORD",
    "RENEW",
    "SAVE",
    "TICK_LOCK",
    "TRACE",
    "UNCLAIM",
]

# Create a run unless one with that id exists.
# KEYS: run hash, runs index, outbox.  ARGV: id, meta, snap, now, advance member, due, budget
CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'v', 1, 'meta', ARGV[2], 'snap', ARGV[3], 'tp', 0, 'tc', 0, 'tt', 0)
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'budget', ARGV[7]) end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[5])
return 1
"""

# Claim the right to make a call (model or tool) by taking its lease; hand back
# everything the call and the save after it need: the run's version, record,
# snapshot and unapplied inbox, and the root's tokens and budget.
# A call is claimed only if the run's record says it is due: a tool call must be
# `running` in the record's calls (approved, if it needed a person), a model call
# must be the one the record asked for (`asked`), and the run must not be
# finished. Whatever message arrives (forged, replayed, early, another run's call),
# nothing runs that the record did not decide.
# KEYS: run hash, lease, outbox, root hash, inbox.
# ARGV: call ("call-2", or "m<seq>" for a model call), kind ("tool" or "model"),
#       seq (model calls), token, lease ms, outbox member, deadline
# Returns {status, attempts, root tokens, root budget or -1, version, meta, snap, inbox};
# status is claimed, gone (no run), done (outcome recorded), refused (the record
# does not call for it) or busy (another worker holds the lease).
CLAIM = """
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
"""

# Keep a lease while its call runs. A lease that lapsed (the worker was too busy
# to renew it in time) is taken back if no other worker claimed the call since.
# KEYS: lease, outbox, run hash.  ARGV: token, lease ms, member, deadline, call, attempt
# Returns 1 kept, 0 lost (another attempt took the call over, or its outcome is in).
RENEW = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif holder == false and redis.call('HGET', KEYS[3], 'a:' .. ARGV[5]) == ARGV[6]
    and redis.call('HEXISTS', KEYS[3], 'r:' .. ARGV[5]) == 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
else
  return 0
end
redis.call('ZADD', KEYS[2], 'XX', ARGV[4], ARGV[3])
return 1
"""

# Record the outcome of a call, once, as an inbox event; release its lease. A
# tool's result counts down the calls still out (`out`): only the last one needs
# the run advanced now (the others leave a late advance in the outbox, just in case).
# The outcome is fenced: it is taken only from the attempt that claimed the call
# last (`a:<call>` still holds its number), so a worker whose lease lapsed and whose
# call another worker took over cannot record a second outcome.
# KEYS: run hash, inbox, outbox, lease.
# ARGV: call, event, done member, advance member, due, token, counted (1/0), attempt
# Returns advance (recorded; advance now), waiting (recorded; others still out),
# duplicate (recorded before), fenced (another attempt took the call over), gone.
RECORD = """
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
"""

# A person's decision (or an expiry) for something pending; used once. A
# decision that comes after the entry's expiry (its score in the pending index)
# is refused, and the expiry's own event (a decline, "no answer came in time")
# is applied in its place, so a late yes never runs a call, tick or no tick.
# KEYS: run hash, inbox, outbox, pending index, pending data.
# ARGV: pending member, decision field, event, advance member, due, now ms, expiry event
# Returns applied, expired (refused: too late; the expiry was applied instead, now or
# before), decided (decided already), not_pending, or gone (no such run).
DECIDE = """
if redis.call('HEXISTS', KEYS[1], 'v') == 0 then return 'gone' end
local before = redis.call('HGET', KEYS[1], ARGV[2])
if before == 'expired' then return 'expired' end
if before then return 'decided' end
if redis.call('HEXISTS', KEYS[5], ARGV[1]) == 0 then return 'not_pending' end
local expires = tonumber(redis.call('ZSCORE', KEYS[4], ARGV[1]) or '0')
local outcome, event = 'applied', ARGV[3]
if expires > 0 and expires <= tonumber(ARGV[6]) then outcome, event = 'expired', ARGV[7] end
redis.call('HSET', KEYS[1], ARGV[2], outcome == 'expired' and 'expired' or 'decided')
redis.call('XADD', KEYS[2], '*', 'e', event)
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[4])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
return outcome
"""

# Save a run if nobody saved it since it was loaded (compare-and-set on `v`),
# with everything that goes with the save, all or nothing. A call that saves its
# own outcome directly (`own`) is refused if that outcome was recorded already.
# KEYS: run hash, inbox, trace, outbox, pending index, pending data, runs index.
# ARGV: expected version, meta, snap, effects (JSON, see RunStore.save).
# The own outcome is fenced like RECORD's: only the attempt that claimed the call last.
# Returns saved, stale (someone saved first), duplicate (the call's outcome was
# recorded already) or fenced (another attempt took the call over).
SAVE = """
if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 'stale' end
local fx = cjson.decode(ARGV[4])
if fx.own ~= nil then
  if redis.call('HEXISTS', KEYS[1], 'r:' .. fx.own.call) == 1 then return 'duplicate' end
  if redis.call('HGET', KEYS[1], 'a:' .. fx.own.call) ~= fx.own.attempt then return 'fenced' end
  if redis.call('GET', fx.own.lease) == fx.own.token then redis.call('DEL', fx.own.lease) end
  redis.call('ZREM', KEYS[4], fx.own.member)
end
redis.call('HSET', KEYS[1], 'v', tonumber(ARGV[1]) + 1, 'meta', ARGV[2], 'snap', ARGV[3])
for _, id in ipairs(fx.applied) do redis.call('XDEL', KEYS[2], id) end
for _, f in ipairs(fx.forget) do redis.call('HDEL', KEYS[1], f) end
local out = 0
for _, c in ipairs(fx.running) do
  if redis.call('HEXISTS', KEYS[1], 'r:' .. c) == 0 then out = out + 1 end
end
redis.call('HSET', KEYS[1], 'out', out)
if #fx.trace > 0 then
  redis.call('RPUSH', KEYS[3], unpack(fx.trace))
  redis.call('LTRIM', KEYS[3], -fx.trace_max, -1)
  redis.call('HINCRBY', KEYS[1], 'tn', #fx.trace)
  redis.call('XADD', fx.activity, 'MAXLEN', '~', 10000, '*', 'r', fx.run)
end
for _, m in ipairs(fx.send) do redis.call('ZADD', KEYS[4], m[2], m[1]) end
for _, m in ipairs(fx.unsend) do redis.call('ZREM', KEYS[4], m) end
for _, p in ipairs(fx.pending_del) do
  redis.call('ZREM', KEYS[5], p)
  redis.call('HDEL', KEYS[6], p)
end
for _, p in ipairs(fx.pending_add) do
  redis.call('ZADD', KEYS[5], p[2], p[1])
  redis.call('HSET', KEYS[6], p[1], p[3])
end
for _, u in ipairs(fx.usage) do
  -- An ancestor that finished and expired is not brought back without a TTL.
  if redis.call('HEXISTS', u[1], 'v') == 1 then
    redis.call('HINCRBY', u[1], 'tp', u[2])
    redis.call('HINCRBY', u[1], 'tc', u[3])
    redis.call('HINCRBY', u[1], 'tt', u[4])
  end
end
for _, c in ipairs(fx.create) do
  if redis.call('EXISTS', c[1]) == 0 then
    redis.call('HSET', c[1], 'v', 1, 'meta', c[3], 'snap', c[4], 'tp', 0, 'tc', 0, 'tt', 0)
    redis.call('ZADD', KEYS[7], c[5], c[2])
    redis.call('ZADD', KEYS[4], c[7], c[6])
  end
end
for _, d in ipairs(fx.deliver) do
  if redis.call('HEXISTS', d[1], 'v') == 1 then
    redis.call('XADD', d[2], '*', 'e', d[3])
    redis.call('ZADD', KEYS[4], d[5], d[4])
    if d[6] == 1 then redis.call('HSET', d[1], 'cancel', 1) end
  end
end
if fx.notes_key ~= '' and #fx.notes > 0 then
  redis.call('RPUSH', fx.notes_key, unpack(fx.notes))
  redis.call('LTRIM', fx.notes_key, -fx.notes_max, -1)
end
if redis.call('XLEN', KEYS[2]) == 0 then
  redis.call('ZREM', KEYS[4], fx.advance)
  redis.call('DEL', KEYS[2])
end
if fx.retention > 0 then
  redis.call('EXPIRE', KEYS[1], fx.retention)
  redis.call('EXPIRE', KEYS[3], fx.retention)
  redis.call('DEL', KEYS[2])
  redis.call('ZREM', KEYS[4], fx.advance)
end
return 'saved'
"""

# Add lines to a run's trace (a list holding its newest lines) and tell followers.
# KEYS: run hash, trace, activity.  ARGV: run id, max lines, lines...
TRACE = """
if redis.call('HEXISTS', KEYS[1], 'v') == 0 then return 0 end
redis.call('RPUSH', KEYS[2], unpack(ARGV, 3))
redis.call('LTRIM', KEYS[2], -tonumber(ARGV[2]), -1)
redis.call('HINCRBY', KEYS[1], 'tn', #ARGV - 2)
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 10000, '*', 'r', ARGV[1])
return 1
"""

# Read a run's trace from position ARGV[1] on (positions count every line ever written).
# KEYS: run hash, trace.  Returns {position after the last line, lines}.
READ_TRACE = """
local total = tonumber(redis.call('HGET', KEYS[1], 'tn') or '0')
local first = total - redis.call('LLEN', KEYS[2])
local from = math.max(0, tonumber(ARGV[1]) - first)
return {total, redis.call('LRANGE', KEYS[2], from, -1)}
"""

# Give a claim back (its call did not start): the attempt is not counted, the
# lease is released, and the call's message is due again at ARGV[5]. Only while
# no later attempt claimed the call (its lease may have lapsed meanwhile).
# KEYS: run hash, lease, outbox.  ARGV: call, attempt, token, member, due
# Returns 1 given back, 0 not ours any more.
UNCLAIM = """
if redis.call('HGET', KEYS[1], 'a:' .. ARGV[1]) ~= ARGV[2] then return 0 end
if redis.call('HINCRBY', KEYS[1], 'a:' .. ARGV[1], -1) <= 0 then
  redis.call('HDEL', KEYS[1], 'a:' .. ARGV[1])
end
if redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[4])
return 1
"""

# Elect the one process that ticks in this interval: the lock lapses after one
# interval, so the next tick happens an interval later, by whichever process asks
# first (a ticker that died with its worker is replaced at the next interval).
# KEYS: lock, tick stats hash.  ARGV: holder, interval ms, now ms
# Returns 0 if this holder won (ticks now), else the ms until the lock lapses.
TICK_LOCK = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('HINCRBY', KEYS[2], 'n', 1)
  redis.call('HSET', KEYS[2], 'last_ms', ARGV[3], 'by', ARGV[1])
  return 0
end
local left = redis.call('PTTL', KEYS[1])
if left < 0 then return tonumber(ARGV[2]) end
return left
"""
