#!lua flags=no-writes,allow-cross-slot-keys
-- SWEEP: read one fleet-wide index over many shards of THIS node in one call (Redis
-- Cluster only; workers.store.shards). The only script that reads more than one slot: it
-- writes nothing, and a shard whose slot this node does not serve (moved by a
-- failover or a reshard since the client last looked) is reported back, not read,
-- so the caller reads that one on its own. One call instead of one command per
-- shard: a tick over all 16384 slots costs milliseconds, not seconds.
--
-- KEYS none (the shards are ARGV: a cluster routes a script by its keys, and these
-- are of many slots)
-- ARGV[1] 'due' (lowest scores from ARGV[2] to ARGV[3]) or 'newest' (highest first)
-- ARGV[2] low  ARGV[3] high  ARGV[4] limit (per shard, and in all)  ARGV[5..] shard keys
-- Returns {member, score, member, score, ...} and the positions (1-based) of the
-- shards not read here.
local limit = tonumber(ARGV[4])
local found, missed = {}, {}
local newest = ARGV[1] == 'newest'
for i = 5, #ARGV do
  local entries
  if newest then
    entries = redis.pcall('ZREVRANGEBYSCORE', ARGV[i], ARGV[3], ARGV[2], 'WITHSCORES',
      'LIMIT', 0, limit)
  else
    entries = redis.pcall('ZRANGEBYSCORE', ARGV[i], ARGV[2], ARGV[3], 'WITHSCORES',
      'LIMIT', 0, limit)
  end
  if entries.err then
    table.insert(missed, i - 4)
  else
    for _, value in ipairs(entries) do table.insert(found, value) end
  end
  -- Due entries: the first `limit` are enough (the next tick takes the rest).
  if not newest and #found >= 2 * limit then break end
end
return {found, missed}
