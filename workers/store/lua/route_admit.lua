-- ROUTE_ADMIT: may this model call use this route now? The fleet's limits in one step.
--
-- In order: a route paused by a 429 (its Retry-After) refuses until then; a route
-- whose circuit is open refuses, but lets one call through as a probe per interval;
-- the route's and the key's calls in flight are capped (each holder expires with its
-- lease, so a dead worker's slot comes back); requests and tokens per minute are
-- spaced evenly (GCRA: each admission moves the route's theoretical arrival time on
-- by one request's, or its tokens', share of a minute).
--
-- Tokens are charged as the route's calls have used them: the running mean of what
-- its calls used (the hash's `used`, learned by ROUTE_DONE), at most what this call
-- may use; the first call is charged all it may use. ROUTE_DONE settles the
-- difference when the call ends, so the route runs at its real token rate and a
-- waiting call is told to come back by what calls use, not by what they may use
-- (until a first call ended, by LEARNING_MS at the latest).
--
-- Calls that must wait queue fairly between keys (start-time fair queuing): a key's
-- next waiting call gets the tag after its previous one, or after the tag last
-- admitted, whichever is later; calls go in tag order (ties by arrival). So a key
-- with a thousand waiting calls and one with five take turns, and a key that shows
-- up late is not put behind the whole backlog. A waiting call is told when to come
-- back (its place in the queue times the spacing); one that has not come back
-- `absent` ms after that does not hold the calls behind it, and after `stale` ms
-- its place is gone.
--
-- KEYS[1] route hash (tat, ttat, paused, circuit, probe, failures, error, round, seq)
-- KEYS[2] key's calls in flight (zset holder -> deadline)
-- KEYS[3..7] on a cluster only: the route's other keys, <route>:inflight, its calls in
-- flight (zset holder -> deadline); :queue, the waiting calls (zset holder -> tag * 1e6
-- + arrival); :queue-keys, waiting holder -> key (hash); :tags, key -> its last tag
-- (hash); :told, waiting holder -> when it was told to come back (zset). A single Redis
-- is sent only the first two (about 140 bytes a call fewer), and the script spells the
-- rest from the route's hash (layout.Keys.route); a cluster's script declares every
-- key it touches, so a slot being moved redirects it before it writes anything.
-- ARGV[1] now  ARGV[2] holder  ARGV[3] key  ARGV[4] ms per request (0: no rpm)
-- ARGV[5] tokens this call may use  ARGV[6] ms per token (0: no tpm)
-- ARGV[7] route's max calls in flight (0: none)  ARGV[8] key's (0: none)
-- ARGV[9] lease (ms)  ARGV[10] probe interval (ms)  ARGV[11] stale (ms)
-- ARGV[12] absent (ms)  ARGV[13] 'leave': only take the call out of the queue (it
-- went to another route, or failed)
-- Returns: {verdict, ms, charged}: admitted (ms 1 if it is the circuit's probe),
-- paused (until), open (next probe), wait (until its turn, or a free slot), or left;
-- charged: the tokens the admission charged (for ROUTE_DONE to settle).
local now, holder, key = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local route, key_inflight = KEYS[1], KEYS[2]
local inflight = KEYS[3] or (route .. ':inflight')
local queue, queue_keys = KEYS[4] or (route .. ':queue'), KEYS[5] or (route .. ':queue-keys')
local tags, told = KEYS[6] or (route .. ':tags'), KEYS[7] or (route .. ':told')
local SCALE, LOOK_AHEAD, LEARNING_MS = 1000000, 32, 2000

local function forget(gone)
  local owner = redis.call('HGET', queue_keys, gone)
  local score = tonumber(redis.call('ZSCORE', queue, gone) or '0')
  local last = owner and tonumber(redis.call('HGET', tags, owner) or '-1')
  if last == math.floor(score / SCALE) then
    redis.call('HDEL', tags, owner)  -- its key's last waiting call: nothing to follow
  end
  redis.call('HDEL', queue_keys, gone)
  redis.call('ZREM', queue, gone)
  redis.call('ZREM', told, gone)
  return score
end

if ARGV[13] == 'leave' then
  if redis.call('ZSCORE', queue, holder) then forget(holder) end
  return {'left', 0, 0}
end

local per_request, tokens, per_token = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local state = redis.call('HMGET', route, 'tat', 'ttat', 'paused', 'circuit', 'probe', 'used')
local charge = math.max(math.min(tokens, math.ceil(tonumber(state[6] or tokens))), 1)
local paused = tonumber(state[3] or '0')
if paused > now then return {'paused', paused, 0} end
local probe = 0
if state[4] == 'open' then
  local next_probe = tonumber(state[5] or '0')
  if now < next_probe then return {'open', next_probe, 0} end
  probe = 1
end

-- Calls in flight: a dead worker's holder lapses with its lease.
local lease_end = now + tonumber(ARGV[9])
local caps = {{inflight, tonumber(ARGV[7])}, {key_inflight, tonumber(ARGV[8])}}
for _, cap in ipairs(caps) do
  redis.call('ZREMRANGEBYSCORE', cap[1], '-inf', now)
  if cap[2] > 0 and not redis.call('ZSCORE', cap[1], holder)
      and redis.call('ZCARD', cap[1]) >= cap[2] then
    return {'wait', now + 250, 0}
  end
end

-- Waiting calls told to come back long ago gave up (their run moved on, or died). Every
-- call told when to come back is in the queue: with none waiting (a route that spaces
-- nothing, most of the time) there is nothing to look through.
local waiting = redis.call('ZCARD', queue)
if waiting > 0 then
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', told, '-inf', now - tonumber(ARGV[11]))) do
    forget(gone)
  end
  waiting = redis.call('ZCARD', queue)
end

local tat = math.max(tonumber(state[1] or '0'), now)
local ttat = math.max(tonumber(state[2] or '0'), now)
local due = math.max(per_request > 0 and tat or now, per_token > 0 and ttat or now)
local step = math.max(per_request, per_token > 0 and charge * per_token or 0, 1)
local place = waiting > 0 and redis.call('ZRANK', queue, holder) or nil
if not place and (waiting > 0 or due > now) then
  -- A new waiter: after its key's last waiting call, or after the last admitted.
  local round = tonumber(redis.call('HGET', route, 'round') or '0')
  local tag = math.max(tonumber(redis.call('HGET', tags, key) or '0'), round) + 1
  local seq = redis.call('HINCRBY', route, 'seq', 1) % SCALE
  redis.call('HSET', tags, key, tag)
  redis.call('HSET', queue_keys, holder, key)
  redis.call('ZADD', queue, tag * SCALE + seq, holder)
  place = redis.call('ZRANK', queue, holder)
end

-- Calls ahead in the queue that are here (not absent past their turn) go first.
local ahead = place or 0
if place and place > 0 and place <= LOOK_AHEAD then
  ahead = 0
  local absent_before = now - tonumber(ARGV[12])
  for _, other in ipairs(redis.call('ZRANGE', queue, 0, place - 1)) do
    if tonumber(redis.call('ZSCORE', told, other) or '0') >= absent_before then
      ahead = ahead + 1
    end
  end
end

if due <= now and ahead == 0 then
  if per_request > 0 then redis.call('HSET', route, 'tat', tat + per_request) end
  if per_token > 0 then redis.call('HSET', route, 'ttat', ttat + charge * per_token) end
  if probe == 1 then
    redis.call('HSET', route, 'probe', now + tonumber(ARGV[10]))
  end
  redis.call('ZADD', inflight, lease_end, holder)
  redis.call('ZADD', key_inflight, lease_end, holder)
  if place then
    local round = math.floor(forget(holder) / SCALE)
    if round > tonumber(redis.call('HGET', route, 'round') or '0') then
      redis.call('HSET', route, 'round', round)
    end
  end
  return {'admitted', probe, charge}
end

local back = math.max(due, now) + ahead * step
if per_token > 0 and not state[6] then
  -- No call here has ended yet, so `step` rests on what calls may use: ask again soon,
  -- when the first call's use will have taught the route what calls really take.
  back = math.min(back, now + LEARNING_MS)
end
redis.call('ZADD', told, back, holder)
return {'wait', back, 0}
