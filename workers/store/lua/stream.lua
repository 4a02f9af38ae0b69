-- STREAM: add events to a run tree's live stream (what `relay.stream` reads), while
-- its root lives.
--
-- A run's hash has a TTL exactly when the run has finished (see workers/store/layout.py):
-- once the root finished (or expired), nothing more is written, so a late piece of
-- a stopped call never makes a stream that outlives its tree.
--
-- Every write renews the stream's TTL (STREAM_IDLE_S): a tree whose model stops
-- streaming sheds it.
--
-- KEYS[1] the root's run hash  KEYS[2] the tree's live stream (on a cluster only: a
-- single Redis's is spelled from KEYS[1], as workers.store.layout.Keys.live spells it)
-- ARGV[1] entries kept (MAXLEN ~)  ARGV[2] seconds to keep it after this write
-- ARGV[3] the run whose events these are  ARGV[4...] the events, two values each: kind, text
-- Returns: added, or ended (the root finished or is gone: nothing was written).
local live = KEYS[2]
if not live then
  local root = string.match(ARGV[3], '^[^.]*')
  local prefix = string.sub(KEYS[1], 1, #KEYS[1] - #root - 4)
  if prefix .. 'run:' .. root ~= KEYS[1] then  -- (a caller's bug: fail, never guess)
    return redis.error_reply('STREAM: ' .. KEYS[1] .. ' is not the root of run ' .. ARGV[3])
  end
  live = prefix .. 'live:' .. root
end
if redis.call('TTL', KEYS[1]) ~= -1 then return 'ended' end
for i = 4, #ARGV, 2 do
  redis.call('XADD', live, 'MAXLEN', '~', ARGV[1], '*', 'k', ARGV[i], 'r', ARGV[3], 't', ARGV[i + 1])
end
redis.call('EXPIRE', live, ARGV[2])
return 'added'
