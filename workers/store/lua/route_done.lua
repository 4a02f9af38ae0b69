-- ROUTE_DONE: what came of a call a route admitted: its slots come back, its circuit
-- and pause learn from it.
--
-- A success closes the circuit. A failure that says the server is in trouble (5xx, a
-- timeout, a refused connection) counts; at `threshold` in a row the circuit opens and
-- only one probe per interval gets through. A 429 pauses the route for the whole
-- fleet until its Retry-After. The tokens the admission charged are settled against
-- what the call used: fewer give the difference back to the tokens-per-minute
-- spacing, more push it on; a call that failed gives back all it was charged. What a
-- call used feeds the route's running mean (`used`), which ROUTE_ADMIT charges next.
--
-- KEYS[1] route hash  KEYS[2] key's calls in flight  KEYS[3] the route's, on a cluster
-- only (a single Redis's script spells it: <route>:inflight; see lua/route_admit.lua)
-- ARGV[1] now  ARGV[2] holder  ARGV[3] outcome: ok, failed, limited, refused (a
-- request the server called wrong: neither the circuit nor the pause hear of it), or
-- stopped (by its caller: a cancelled run, a lost lease; likewise)
-- ARGV[4] pause until (ms; limited, or ok with nothing left)  ARGV[5] tokens charged
-- ARGV[6] ms per token  ARGV[7] failures that open the circuit  ARGV[8] probe interval (ms)
-- ARGV[9] the error, for `relay routes` ('' for none)
-- ARGV[10] tokens used ('' when unknown: the call failed)
-- Returns: the circuit's state (closed or open).
local route, key_inflight = KEYS[1], KEYS[2]
local inflight = KEYS[3] or (route .. ':inflight')
redis.call('ZREM', inflight, ARGV[2])
redis.call('ZREM', key_inflight, ARGV[2])
local now, outcome = tonumber(ARGV[1]), ARGV[3]
local charged, per_token, used = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[10])
local over = ((used or 0) - charged) * per_token
if over ~= 0 then
  local ttat = tonumber(redis.call('HGET', route, 'ttat') or '0')
  if over > 0 then ttat = math.max(ttat, now) + over else ttat = math.max(ttat + over, now) end
  redis.call('HSET', route, 'ttat', ttat)
end
if used then
  local mean = tonumber(redis.call('HGET', route, 'used') or used)
  redis.call('HSET', route, 'used', mean + (used - mean) / 4)
end
if ARGV[9] ~= '' then redis.call('HSET', route, 'error', ARGV[9], 'error_at', now) end
if (outcome == 'ok' or outcome == 'limited') and tonumber(ARGV[4]) > now then
  -- A 429's wait, or a success that said nothing is left until a reset: the fleet pauses.
  local paused = tonumber(redis.call('HGET', route, 'paused') or '0')
  redis.call('HSET', route, 'paused', math.max(paused, tonumber(ARGV[4])))
end
if outcome == 'ok' then
  redis.call('HSET', route, 'circuit', 'closed', 'failures', 0)
  return 'closed'
end
if outcome == 'failed' or outcome == 'limited' then
  local failures = redis.call('HINCRBY', route, 'failures', 1)
  if failures >= tonumber(ARGV[7]) then
    if redis.call('HGET', route, 'circuit') ~= 'open' then
      redis.call('HSET', route, 'circuit', 'open', 'opened', now)
    end
    redis.call('HSET', route, 'probe', now + tonumber(ARGV[8]))
    return 'open'
  end
end
return redis.call('HGET', route, 'circuit') or 'closed'
