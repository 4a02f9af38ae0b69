-- SAVE: save a run if nobody saved it since it was loaded (compare-and-set on `v`),
-- with everything that goes with the step, all or nothing.
--
-- A call that saves its own outcome with the run (`own`) is refused if that outcome
-- was recorded already, and fenced like RECORD's: only the attempt that claimed the
-- call last. The effects JSON is built in one place, workers.store.codec.save_effects,
-- and holds only the effects this step has (an absent one is empty).
--
-- The agent's snapshot is stored apart (form 2, see workers.store.snapshots): a new head
-- in the hash, and the history list changed as the step changed it (its oldest
-- entries dropped, new ones appended) or, with ARGV[6] = 1, written whole (which
-- also migrates a run stored as one `snap`, and drops `sf`, which a head now says). An empty head leaves the snapshot as it is.
--
-- A run that finishes gets a TTL (the retention) on its hash, history and trace (its
-- inbox goes once empty: an event that came after the step read it stays, with its
-- advance), and a "done" event in its tree's live stream if there is one (which then
-- expires after fx.live_ttl: STREAM_KEEP_S for a root, STREAM_IDLE_S for a specialist);
-- a run that parks for a person shortens its tree's stream's TTL to fx.live_ttl
-- (STREAM_PARKED_S).
-- A run a follow-up reopens loses its TTLs again. A run whose list changes (running,
-- waiting, done, failed, ...: engine.records.RunList) moves between those indexes
-- (fx.relist); specialists made here join the running list (fx.running_list).
--
-- The record is written without its fixed fields (id, task, config, ...: `fixed`, written
-- when the run was made), and the head without the agent's start (`start`, likewise);
-- fx.fixed and fx.start write them for a run saved before they were kept apart, or one
-- whose record could not be read. The head leaves out the agent's loop counters too
-- (`lp`): fx.loops writes them when the step changed them (none at all: `lp` is deleted).
--
-- A model call's own outcome may carry what its route hears (fx.own.route, a single
-- Redis only): ROUTE_DONE's `ok`, run here (`--# route_done`) before the version check,
-- so the route is told once, in the save's round trip, whatever the save answers.
--
-- The step's journal entry (ARGV[7]) is appended to the run's journal, which keeps its
-- newest JOURNAL_MAX entries (workers.engine.journal); a specialist made here gets its
-- journal's start.
--
-- KEYS[1] run hash, then on a cluster only (a single Redis's are spelled from KEYS[1]):
-- KEYS[2] inbox  KEYS[3] trace  KEYS[4] outbox  KEYS[5] pending index
-- KEYS[6] pending data  KEYS[7] runs index  KEYS[8] history list  KEYS[9] journal list
-- ARGV[1] expected version  ARGV[2] record JSON (the fields a step changes)
-- ARGV[3] snapshot head ('' to keep)
-- ARGV[4] effects JSON  ARGV[5] history entries to drop from the front
-- ARGV[6] 1 to write the history whole  ARGV[7] the journal entry ('' for none)
-- ARGV[8] what a claim may take now (`due`, written with the record and its version:
-- see lua/claim.lua)
-- ARGV[9] n, the number of trace lines  ARGV[10..9+n] the trace lines
-- ARGV[10+n..] history entries to append
-- Returns: saved, stale (someone saved first: reload and try again), duplicate (the
-- call's own outcome was recorded already) or fenced (another attempt took it over).
local none = {}
local function push(key, values, from, to)
  to = to or #values
  local length = 0
  for i = from, to, 1000 do
    length = redis.call('RPUSH', key, unpack(values, i, math.min(i + 999, to)))
  end
  return length
end
--# route_done
--# totals
local traced = tonumber(ARGV[9])
local entries = 10 + traced  -- (the first history entry to append)
local fx = cjson.decode(ARGV[4])
-- The keys a step's own call and trace touch are spelled here from the run's, not sent
-- with every step: KEYS[1] is <prefix>run:<tree>, the tree the run's id (on a cluster,
-- fx.tree: its root in braces; workers.store.layout.Keys.tree).
local run = fx.run
local tree = fx.tree or run
local prefix = string.sub(KEYS[1], 1, #KEYS[1] - #tree - 4)
if prefix .. 'run:' .. tree ~= KEYS[1] then  -- (a caller's bug: fail, never guess)
  return redis.error_reply('SAVE: ' .. KEYS[1] .. ' is not the key of run ' .. run)
end
local own = fx.own
if own ~= nil and own.route ~= nil then
  -- The model route that gave this call's reply hears how it went (ROUTE_DONE's `ok`:
  -- its slots back, its circuit closed), whatever the save answers below: a refused save
  -- made the call all the same. A single Redis's only, its route keys spelled as
  -- layout.Keys.route and .key_inflight spell them (a cluster's are in other slots).
  local r = own.route  -- [route, key, holder, now, paused until, charged, used, ms/token]
  route_done({prefix .. 'route:' .. r[1], prefix .. 'key-inflight:' .. r[2]},
    {r[4], r[3], 'ok', r[5], r[6], r[8], 0, 0, '', r[7]})
end
-- The version, and for a call's own outcome its result (recorded already?) and attempt
-- (the fence), in one read.
local at = own and redis.call('HMGET', KEYS[1], 'v', 'r:' .. own.call, 'a:' .. own.call)
  or {redis.call('HGET', KEYS[1], 'v')}
if at[1] ~= ARGV[1] then return 'stale' end
local version = tonumber(ARGV[1]) + 1
-- (`due` names the version it was written at: CLAIM trusts it only at that version, so
-- a record saved without it, by an older worker, is decoded instead.)
local due = version .. '|' .. ARGV[8]
local activity = fx.activity or (prefix .. 'activity')  -- (a cluster's names its shard)
-- On a single Redis only KEYS[1] is sent (about 250 bytes a step fewer): the run's other
-- keys are spelled from it as workers.store.layout.Keys spells them. On a cluster every
-- key is sent, so that a slot being moved redirects the script before it writes.
local inbox = KEYS[2] or (prefix .. 'inbox:' .. tree)
local trace = KEYS[3] or (prefix .. 'trace:' .. tree)
local outbox = KEYS[4] or (prefix .. 'outbox')
local pending = KEYS[5] or (prefix .. 'pending')
local pending_data = KEYS[6] or (prefix .. 'pending:data')
local runs = KEYS[7] or (prefix .. 'runs')
local history = KEYS[8] or (prefix .. 'hist:' .. tree)
local journal = KEYS[9] or (prefix .. 'jr:' .. tree)
if own ~= nil then
  if at[2] then return 'duplicate' end
  if at[3] ~= own.attempt then return 'fenced' end
  local lease = prefix .. 'lease:' .. tree .. ':' .. own.call  -- (layout.Keys.lease)
  if redis.call('GET', lease) == own.token then redis.call('DEL', lease) end
  -- (OutboxMember.model or .tool: a model call `m<seq>` is `m|<run>|<seq>`.)
  local tail = own.kind == 'm' and string.sub(own.call, 2) or own.call
  redis.call('ZREM', outbox, own.kind .. '|' .. run .. '|' .. tail)
end
local out = 0
for _, c in ipairs(fx.running or none) do
  if redis.call('HEXISTS', KEYS[1], 'r:' .. c) == 0 then out = out + 1 end
end
-- (No calls out is no field: a parked run keeps what it must, each field ~50 bytes.)
if out > 0 then redis.call('HSET', KEYS[1], 'out', out) else redis.call('HDEL', KEYS[1], 'out') end
if ARGV[3] == '' then
  redis.call('HSET', KEYS[1], 'v', version, 'meta', ARGV[2], 'due', due)
elseif ARGV[6] == '1' then
  redis.call('HSET', KEYS[1], 'v', version, 'meta', ARGV[2], 'due', due, 'head', ARGV[3])
  redis.call('HDEL', KEYS[1], 'snap', 'sf')
  redis.call('DEL', history)
  push(history, ARGV, entries)
else
  redis.call('HSET', KEYS[1], 'v', version, 'meta', ARGV[2], 'due', due, 'head', ARGV[3])
  if ARGV[5] ~= '0' then redis.call('LTRIM', history, ARGV[5], -1) end
  push(history, ARGV, entries)
end
if fx.fixed then redis.call('HSET', KEYS[1], 'fixed', fx.fixed) end
if fx.start then redis.call('HSET', KEYS[1], 'start', fx.start) end
if fx.loops == '{}' then redis.call('HDEL', KEYS[1], 'lp')  -- (none: a parked run keeps no field)
elseif fx.loops then redis.call('HSET', KEYS[1], 'lp', fx.loops) end
if ARGV[7] ~= '' and redis.call('RPUSH', journal, ARGV[7]) > ${JOURNAL_MAX} then
  redis.call('LTRIM', journal, -${JOURNAL_MAX}, -1)
end
-- (One command for each list of ids or fields, not one each: a step runs fewer.)
if fx.applied then redis.call('XDEL', inbox, unpack(fx.applied)) end
-- A stale call's markers (layout.RunFields: result, attempts, noted, carrier), and the
-- follow-up flag: sent as the calls' names, to save each step a few dozen bytes.
local forget = {}
for _, c in ipairs(fx.stale or none) do
  for _, marker in ipairs({'r:', 'a:', 'n:', 'k:'}) do forget[#forget + 1] = marker .. c end
end
if fx.follow_up then forget[#forget + 1] = 'fu' end
if #forget > 0 then redis.call('HDEL', KEYS[1], unpack(forget)) end
if traced > 0 then
  if push(trace, ARGV, 10, 9 + traced) > ${TRACE_MAX} then
    redis.call('LTRIM', trace, -${TRACE_MAX}, -1)
  end
  redis.call('HINCRBY', KEYS[1], 'tn', traced)
  redis.call('XADD', activity, 'MAXLEN', '~', 10000, '*', 'r', run)
end
for _, m in ipairs(fx.sends or none) do redis.call('ZADD', outbox, m[2], m[1]) end
for _, m in ipairs(fx.unsend or none) do redis.call('ZREM', outbox, m) end
for _, p in ipairs(fx.pending_del or none) do
  redis.call('ZREM', pending, p)
  redis.call('HDEL', pending_data, p)
end
for _, p in ipairs(fx.pending_add or none) do
  redis.call('ZADD', pending, p[2], p[1])
  redis.call('HSET', pending_data, p[1], p[3])
end
-- (A run's hash is named '' where it is this run's own: KEYS[1].)
for _, u in ipairs(fx.usage_adds or none) do
  local run = u[1] == '' and KEYS[1] or u[1]
  -- An ancestor that finished and expired is not brought back without a TTL (the run
  -- saved is there: its version was read above).
  if u[1] == '' or redis.call('HEXISTS', run, 'v') == 1 then
    local sums, apart = totals({run}, none)
    for i = 1, 7 do sums[i] = string.format('%d', sums[i] + u[i + 1]) end
    redis.call('HSET', run, 'u', table.concat(sums, ' '))
    if apart then redis.call('HDEL', run, 'tp', 'tc', 'tt', 'cc', 'cu', 'mc', 'np') end
  end
end
for _, q in ipairs(fx.settle or none) do
  -- A model call's reservation on its tree's budget goes once its outcome is in.
  local root = q[1] == '' and KEYS[1] or q[1]
  local held = redis.call('HGET', root, q[2])
  if held then
    local tokens, cost = string.match(held, '^(%d+):(%d+)')  -- (then ':<cap>')
    -- (0 - n, not -n: Redis refuses the text "-0" as a number.)
    redis.call('HINCRBY', root, 'rt', 0 - tonumber(tokens))
    redis.call('HINCRBY', root, 'ru', 0 - tonumber(cost))
    redis.call('HINCRBY', root, 'rc', -1)
    redis.call('HDEL', root, q[2])
  end
end
for _, c in ipairs(fx.create or none) do
  if redis.call('EXISTS', c[1]) == 0 then
    redis.call('HSET', c[1], 'v', 1, 'meta', c[3], 'fixed', c[11], 'head', c[4])
    if c[12] ~= '{}' then redis.call('HSET', c[1], 'start', c[12]) end  -- (as CREATE)
    redis.call('DEL', c[8])
    redis.call('DEL', c[9])
    redis.call('RPUSH', c[9], c[10])
    push(c[8], c, 13)
    redis.call('ZADD', runs, c[5], c[2])
    redis.call('ZADD', fx.running_list, c[5], c[2])
    redis.call('ZADD', outbox, c[7], c[6])
  end
end
if fx.relist then
  redis.call('ZREM', fx.relist[1], fx.relist[4])
  redis.call('ZADD', fx.relist[2], fx.relist[3], fx.relist[4])
end
for _, d in ipairs(fx.deliveries or none) do
  if redis.call('HEXISTS', d[1], 'v') == 1 then
    redis.call('XADD', d[2], '*', 'e', d[3])
    redis.call('ZADD', outbox, d[5], d[4])
    if d[6] == 1 then redis.call('HSET', d[1], 'cancel', 1) end
  end
end
if fx.notes_key and fx.notes then
  redis.call('RPUSH', fx.notes_key, unpack(fx.notes))
  redis.call('LTRIM', fx.notes_key, -fx.notes_max, -1)
end
if redis.call('XLEN', inbox) == 0 then
  redis.call('ZREM', outbox, 'a|' .. run)  -- (the run's advance: OutboxMember.advance)
  redis.call('DEL', inbox)
end
if fx.done_summary and redis.call('EXISTS', fx.live) == 1 then
  -- Followers of the tree's live stream learn the run ended; a tree that never
  -- streamed gets no stream for it.
  redis.call('XADD', fx.live, 'MAXLEN', '~', fx.live_max, '*', 'k', 'done', 'r', run,
    't', fx.done_summary)
  redis.call('EXPIRE', fx.live, fx.live_ttl)
elseif fx.parks then
  -- A run parked for a person: its tree's stream goes soon, unless an event renews it.
  redis.call('EXPIRE', fx.live, fx.live_ttl, 'LT')
end
if fx.retention then
  redis.call('EXPIRE', KEYS[1], fx.retention)
  redis.call('EXPIRE', trace, fx.retention)
  redis.call('EXPIRE', history, fx.retention)
  redis.call('EXPIRE', journal, fx.retention)
  -- (The inbox went above if the step applied all of it. What reached it after the step
  -- read it, a person's follow-up above all, stays with its advance: the run is woken
  -- again, and reopens or drops it; should the run expire first, its inbox goes too.)
  redis.call('EXPIRE', inbox, fx.retention)
elseif fx.reopened then
  -- A follow-up reopened a finished run: it lives again.
  redis.call('PERSIST', inbox)
  redis.call('PERSIST', KEYS[1])
  redis.call('PERSIST', trace)
  redis.call('PERSIST', history)
  redis.call('PERSIST', journal)
end
return 'saved'
