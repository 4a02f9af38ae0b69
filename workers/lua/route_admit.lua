-- ROUTE_ADMIT: may this model call use this route now? The fleet's limits in one step.
--
-- In order: a route paused by a 429 (its Retry-After) refuses until then; a route
-- whose circuit is open refuses, but lets one call through as a probe per interval;
-- the route's and the key's calls in flight are capped (each holder expires with its
-- lease, so a dead worker's slot comes back); requests and tokens per minute are
-- spaced evenly (GCRA: each admission moves the route's theoretical arrival time on
-- by one request's, or its tokens', share of a minute). While calls wait, each gets a
-- slot in turn, the waiting keys round-robin (a key's n-th waiting call after every
-- other waiting key's n-th), so one key's thousand calls do not starve another's five;
-- a call is admitted at its slot. A slot not come back for within `stale` goes.
--
-- KEYS[1] route hash (tat, ttat, paused, circuit, probe, failures, error)
-- KEYS[2] route's calls in flight (zset holder -> deadline)
-- KEYS[3] key's calls in flight (zset holder -> deadline)
-- KEYS[4] waiting slots (zset holder -> slot ms)  KEYS[5] waiting holder -> key (hash)
-- KEYS[6] waiting calls per key (hash)  KEYS[7] keys by when last served (zset)
-- ARGV[1] now  ARGV[2] holder  ARGV[3] key  ARGV[4] ms per request (0: no rpm)
-- ARGV[5] tokens this call may use  ARGV[6] ms per token (0: no tpm)
-- ARGV[7] route's max calls in flight (0: none)  ARGV[8] key's (0: none)
-- ARGV[9] lease (ms)  ARGV[10] probe interval (ms)  ARGV[11] stale (ms)
-- Returns: {verdict, ms}: admitted (ms 1 if it is the circuit's probe), paused (until),
-- open (next probe), or wait (until its slot, or a free slot).
local now, holder, key = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local per_request, tokens, per_token = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local state = redis.call('HMGET', KEYS[1], 'tat', 'ttat', 'paused', 'circuit', 'probe')
local paused = tonumber(state[3] or '0')
if paused > now then return {'paused', paused} end
local probe = 0
if state[4] == 'open' then
  local next_probe = tonumber(state[5] or '0')
  if now < next_probe then return {'open', next_probe} end
  probe = 1
end

-- Calls in flight: a dead worker's holder lapses with its lease.
local lease_end = now + tonumber(ARGV[9])
local caps = {{KEYS[2], tonumber(ARGV[7])}, {KEYS[3], tonumber(ARGV[8])}}
for _, cap in ipairs(caps) do
  redis.call('ZREMRANGEBYSCORE', cap[1], '-inf', now)
  if cap[2] > 0 and not redis.call('ZSCORE', cap[1], holder)
      and redis.call('ZCARD', cap[1]) >= cap[2] then
    return {'wait', now + 250}
  end
end

-- Waiting calls whose slot passed long ago gave up (their run moved on, or died).
local stale = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - tonumber(ARGV[11]))
for _, gone in ipairs(stale) do
  local owner = redis.call('HGET', KEYS[5], gone)
  if owner and redis.call('HINCRBY', KEYS[6], owner, -1) <= 0 then
    redis.call('HDEL', KEYS[6], owner)
  end
  redis.call('HDEL', KEYS[5], gone)
  redis.call('ZREM', KEYS[4], gone)
end

local tat = math.max(tonumber(state[1] or '0'), now)
local ttat = math.max(tonumber(state[2] or '0'), now)
local due = math.max(per_request > 0 and tat or now, per_token > 0 and ttat or now)
local slot = tonumber(redis.call('ZSCORE', KEYS[4], holder) or '-1')
local waiting = redis.call('ZCARD', KEYS[4])
if due <= now and (waiting == 0 or (slot >= 0 and slot <= now)) then
  if per_request > 0 then redis.call('HSET', KEYS[1], 'tat', tat + per_request) end
  if per_token > 0 then redis.call('HSET', KEYS[1], 'ttat', ttat + tokens * per_token) end
  if probe == 1 then
    redis.call('HSET', KEYS[1], 'probe', now + tonumber(ARGV[10]))
  end
  redis.call('ZADD', KEYS[2], lease_end, holder)
  redis.call('ZADD', KEYS[3], lease_end, holder)
  if slot >= 0 then
    if redis.call('HINCRBY', KEYS[6], key, -1) <= 0 then redis.call('HDEL', KEYS[6], key) end
    redis.call('HDEL', KEYS[5], holder)
    redis.call('ZREM', KEYS[4], holder)
  end
  redis.call('ZADD', KEYS[7], now, key)
  return {'admitted', probe}
end

if slot < 0 then
  -- A new waiter: its turn comes after every other waiting key's turn at its depth.
  local depth = redis.call('HINCRBY', KEYS[6], key, 1)
  local keys = redis.call('HLEN', KEYS[6])
  redis.call('ZREMRANGEBYSCORE', KEYS[7], 1, now - 600000)  -- keys long gone
  if not redis.call('ZSCORE', KEYS[7], key) then redis.call('ZADD', KEYS[7], 0, key) end
  local rank = 0
  local ahead = redis.call('ZRANGE', KEYS[7], 0, -1)
  for _, other in ipairs(ahead) do
    if other == key then break end
    if redis.call('HEXISTS', KEYS[6], other) == 1 then rank = rank + 1 end
  end
  local step = math.max(per_request, per_token > 0 and tokens * per_token or 0, 1)
  slot = math.max(due, now) + ((depth - 1) * keys + rank) * step
  redis.call('ZADD', KEYS[4], slot, holder)
  redis.call('HSET', KEYS[5], holder, key)
end
return {'wait', math.max(slot, due)}
