-- CLAIM: take the right to make a call (a model call or a tool call): its lease.
--
-- A call is claimed only if the run's record says it is due: a tool call must be
-- `running` in the record's calls (approved, if it needed a person), a model call
-- must be the one the record asked for at its current step, and the run must not
-- be finished. Whatever message arrives (forged, replayed, early, another run's),
-- nothing runs that the record did not decide. A claim counts the attempt (the
-- fence that RECORD and SAVE check) and hands back what the call and the save
-- after it need, so neither reads the run again: the agent's snapshot (the head
-- and history list, or the whole snapshot of a run stored before form 2) only if
-- the run is not at the version whose agent the caller keeps (ARGV[11]).
--
-- A model call is also admitted against its tree's budget (on the root's hash):
-- its prompt (the request's size in bytes / 2) and a reply of at least FLOOR tokens
-- (or max_tokens, if smaller; in micro-dollars at the highest price it may be
-- charged) must fit in each limit less what is spent and what calls in flight
-- reserved. Admitted, the reply's cap is max_tokens, or less: what the tree has left
-- (so a call cannot take the tree past its limits by its reply), and the estimate
-- (prompt plus that cap) is reserved (`q:<run>|<call>` = "tokens:micro-dollars:cap",
-- once however often the call is claimed: a second claim gets the same cap) until the
-- save that applies its outcome settles it (in a tree with no limits at all, nothing is
-- reserved: nothing reads it, and such a tree never gets one). Not admitted, the claim
-- still counts and takes the lease (the worker records "budget reached", and the run
-- parks), and `over` says which limit: "limit|spent|reserved|cap|estimate", or
-- "deadline".
--
-- KEYS[1] run hash, then on a cluster only (a single Redis's are spelled from KEYS[1]):
-- KEYS[2] the call's lease  KEYS[3] outbox  KEYS[4] root's hash  KEYS[5] inbox
-- KEYS[6] history list
-- ARGV[1] the call ("call-2", or "m<seq>")  ARGV[2] "tool" or "model"
-- ARGV[3] seq (model calls)  ARGV[4] token  ARGV[5] lease (ms)
-- ARGV[6] lease deadline (ms)  ARGV[7] run id  ARGV[8] max_tokens (0: none)
-- ARGV[9] input and ARGV[10] output price, micro-dollars per token
-- ARGV[11] the version whose agent the caller keeps ('' for none)
-- ARGV[12] the Celery task that carries the claim ('' if none): kept as `k:<call>`, and
-- the one it replaces handed back (the task of the attempt before, lost if it is there)
-- Returns: {status, attempts, over, reply cap (0: none), version, record, form,
-- head or whole snapshot, history entries, inbox, the task before, the record's fixed
-- fields, the agent's start, its loop counters (all three '' too when the caller keeps
-- the agent)}; status is
-- claimed, gone (no run), done (outcome recorded), refused (the record does not
-- call for it) or busy (another worker holds the lease).
--# totals
local FLOOR = 256  -- the smallest reply worth asking for (a cut reply is asked again)
local function answer(status) return {status, 0, '', 0, '', '', '', '', {}, {}, '', '', '', ''} end

-- Is the call due (and the model request's size, for a model call)? Read from `due`,
-- which SAVE writes with the record ("<version>|<model seq>|<asked bytes>|<running tool
-- calls>", workers.store.codec.claimable), so most claims decode no JSON. A run no SAVE
-- wrote yet, one saved before `due` was kept, or one whose `due` is not of its version
-- (saved by an older worker) has its record decoded.
local function due(run)
  local at, model, bytes, tools = string.match(run[4] or '', '^(%d+)|(%d*)|(%d*)|(.*)$')
  if at == run[1] then
    if ARGV[2] == 'tool' then
      for call in string.gmatch(tools, '%S+') do
        if call == ARGV[1] then return true, 0 end
      end
      return false, 0
    end
    return model ~= '' and tonumber(model) == tonumber(ARGV[3]), tonumber(bytes) or 0
  end
  local ok, record = pcall(cjson.decode, run[2] or '')
  if not ok or type(record) ~= 'table' or record.state == 'finished' then return false, 0 end
  if ARGV[2] == 'tool' then
    local calls = record.calls
    local track = type(calls) == 'table' and calls[ARGV[1]] or nil
    return type(track) == 'table' and track.status == 'running', 0
  end
  -- (the model call the run waits on at this step, none other)
  local seq = tonumber(ARGV[3])
  return record.asked == seq and (record.seq or 0) == seq, tonumber(record.asked_bytes) or 0
end

-- On a single Redis only KEYS[1] is sent (about 150 bytes a claim fewer): the others are
-- spelled from it and the run's id as workers.store.layout.Keys spells them. On a
-- cluster every key is sent, so that a slot being moved redirects the script first.
local lease, outbox, root_hash, inbox_key, history = KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
if not lease then
  local prefix = string.sub(KEYS[1], 1, #KEYS[1] - #ARGV[7] - 4)
  if prefix .. 'run:' .. ARGV[7] ~= KEYS[1] then  -- (a caller's bug: fail, never guess)
    return redis.error_reply('CLAIM: ' .. KEYS[1] .. ' is not the key of run ' .. ARGV[7])
  end
  lease = prefix .. 'lease:' .. ARGV[7] .. ':' .. ARGV[1]
  outbox = prefix .. 'outbox'
  root_hash = prefix .. 'run:' .. string.match(ARGV[7], '^[^.]*')
  inbox_key = prefix .. 'inbox:' .. ARGV[7]
  history = prefix .. 'hist:' .. ARGV[7]
end
local run = redis.call('HMGET', KEYS[1], 'v', 'meta', 'sf', 'due', 'r:' .. ARGV[1])
if not run[1] then return answer('gone') end
if run[5] then return answer('done') end  -- (its outcome is recorded)
local is_due, asked_bytes = due(run)
if not is_due then return answer('refused') end
-- (Taken as it is checked, SET NX: another attempt's lease refuses the claim before it writes.)
if not redis.call('SET', lease, ARGV[4], 'PX', ARGV[5], 'NX') then return answer('busy') end

local over, cap = '', 0
if ARGV[2] == 'model' then
  local root = redis.call('HMGET', root_hash, 'lt', 'lu', 'lc', 'ld', 'rt', 'ru', 'rc')
  -- (What a tree spent is read only if it has a limit to hold it to.)
  local spent = {0, 0, 0, 0, 0, 0, 0}
  if root[1] or root[2] or root[3] then spent = totals({root_hash}, {}) end
  root = {root[1], root[2], root[3], root[4], spent[3], spent[5], spent[6], root[5], root[6],
    root[7]}
  local held = 'q:' .. ARGV[7] .. '|' .. ARGV[1]
  local n = function(i) return tonumber(root[i] or '0') end
  local int = function(x) return string.format('%d', x) end
  -- A tree with no limits at all reserves nothing: nothing would read it, and it never
  -- gets one (EXTEND raises only the limits a tree has).
  local limited = root[1] or root[2] or root[3] or root[4]
  local kept = limited and redis.call('HGET', root_hash, held)
  local function past_deadline()  -- by Redis's clock, not the caller's
    local time = redis.call('TIME')
    return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000) >= n(4)
  end
  if root[4] and past_deadline() then
    over = 'deadline'
  elseif kept then
    cap = tonumber(string.match(kept, '^%d+:%d+:(%d+)$') or '0')  -- as its first claim got
  else
    local prompt = math.ceil(asked_bytes / 2)
    local most, in_price, out_price = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
    local floor = most > 0 and math.min(most, FLOOR) or FLOOR
    local room = most > 0 and most or math.huge
    if root[1] then room = math.min(room, n(1) - n(5) - n(8) - prompt) end
    if root[2] and out_price > 0 then
      room = math.min(room, math.floor((n(2) - n(6) - n(9) - prompt * in_price) / out_price))
    end
    local least = math.ceil(prompt * in_price + floor * out_price)
    local checks = {{'tokens', 1, 5, 8, prompt + floor}, {'usd', 2, 6, 9, least},
      {'model_calls', 3, 7, 10, 1}}
    for _, c in ipairs(checks) do
      if over == '' and root[c[2]] and n(c[3]) + n(c[4]) + c[5] > n(c[2]) then
        over = table.concat({c[1], int(n(c[3])), int(n(c[4])), int(n(c[2])), int(c[5])}, '|')
      end
    end
    if over == '' then
      cap = room == math.huge and 0 or math.max(room, 0)
    end
    if over == '' and limited then
      local tokens = prompt + cap
      local cost = math.ceil(prompt * in_price + cap * out_price)
      redis.call('HINCRBY', root_hash, 'rt', tokens)
      redis.call('HINCRBY', root_hash, 'ru', cost)
      redis.call('HINCRBY', root_hash, 'rc', 1)
      redis.call('HSET', root_hash, held, int(tokens) .. ':' .. int(cost) .. ':' .. int(cap))
    end
  end
end

local attempts = redis.call('HINCRBY', KEYS[1], 'a:' .. ARGV[1], 1)
local before = redis.call('HGET', KEYS[1], 'k:' .. ARGV[1]) or ''
if ARGV[12] ~= '' then
  redis.call('HSET', KEYS[1], 'k:' .. ARGV[1], ARGV[12])
elseif before ~= '' then
  redis.call('HDEL', KEYS[1], 'k:' .. ARGV[1])
end
-- The call's message, due again when the lease ends (OutboxMember.tool or .model).
local member = ARGV[2] == 'tool' and ('t|' .. ARGV[7] .. '|' .. ARGV[1])
  or ('m|' .. ARGV[7] .. '|' .. ARGV[3])
redis.call('ZADD', outbox, ARGV[6], member)
local inbox = redis.call('XRANGE', inbox_key, '-', '+', 'COUNT', 1000)
if run[1] == ARGV[11] then
  return {'claimed', attempts, over, cap, run[1], run[2], '', '', {}, inbox, before, '', '', ''}
end
local kept = redis.call('HMGET', KEYS[1], 'fixed', 'start', 'head', 'snap', 'lp')
if run[3] == '2' or kept[3] then  -- (form 2: a head, once `sf` 2 too)
  return {'claimed', attempts, over, cap, run[1], run[2], '2', kept[3] or '',
    redis.call('LRANGE', history, 0, -1), inbox, before, kept[1] or '', kept[2] or '',
    kept[5] or ''}
end
return {'claimed', attempts, over, cap, run[1], run[2], '', kept[4] or '', {}, inbox, before,
  kept[1] or '', kept[2] or '', kept[5] or ''}
