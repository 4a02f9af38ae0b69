-- LOAD: read a run to advance it: version, record, the agent's snapshot, the inbox.
--
-- The snapshot (the head and history list, or the whole snapshot of a run stored
-- before form 2) is left out when the run is still at the version whose agent the
-- caller keeps (ARGV[1]): the common step reads only the version and the record.
--
-- KEYS[1] run hash  KEYS[2] history list  KEYS[3] inbox
-- ARGV[1] the version whose agent the caller keeps ('' for none)
-- Returns: {version, record, form, head or whole snapshot, history entries, inbox,
-- the record's fixed fields, the agent's start, its loop counters (all three '' too
-- when the caller keeps the agent)}; version '' when there is no such run.
local run = redis.call('HMGET', KEYS[1], 'v', 'meta', 'sf')
if not run[1] then return {'', '', '', '', {}, {}, '', '', ''} end
local inbox = redis.call('XRANGE', KEYS[3], '-', '+', 'COUNT', 1000)
if run[1] == ARGV[1] then return {run[1], run[2] or '', '', '', {}, inbox, '', '', ''} end
local kept = redis.call('HMGET', KEYS[1], 'fixed', 'start', 'head', 'snap', 'lp')
local fixed, start, loops = kept[1] or '', kept[2] or '', kept[5] or ''
if run[3] == '2' or kept[3] then  -- (form 2: a head, once `sf` 2 too)
  return {run[1], run[2] or '', '2', kept[3] or '', redis.call('LRANGE', KEYS[2], 0, -1), inbox,
    fixed, start, loops}
end
return {run[1], run[2] or '', '', kept[4] or '', {}, inbox, fixed, start, loops}
