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
-- KEYS[1] the root's run hash  KEYS[2] the tree's live stream
-- ARGV[1] entries kept (MAXLEN ~)  ARGV[2] seconds to keep it after this write
-- ARGV[3...] the events, three values each: kind, run id, text
-- Returns: added, or ended (the root finished or is gone: nothing was written).
if redis.call('TTL', KEYS[1]) ~= -1 then return 'ended' end
for i = 3, #ARGV, 3 do
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*',
    'k', ARGV[i], 'r', ARGV[i + 1], 't', ARGV[i + 2])
end
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 'added'
