-- EXTEND: raise a tree's budget and let the runs parked at it go on.
--
-- Each limit the tree has (`lt` tokens, `lu` micro-dollars, `lc` model calls, `ld`
-- the deadline) is raised by the amount given; a limit the tree never had stays
-- unlimited. Each run still parked at the budget (its pending entry named in ARGV)
-- is decided once, like an approval: the entry goes, the run's inbox gets a
-- BudgetExtended event, and the run is woken. A raise that raises no limit the tree
-- has wakes nobody: the runs would only park again, and the caller is told so.
--
-- A raise that names the wait it answers (ARGV[7], a person's form: "the budget of
-- run R at step N") is that wait's one decision, checked here with the raise so two
-- sent at once cannot both pass: refused, raising nothing, once the entry is gone
-- (decided already, or the run went on), and refused when, after it, the tree would
-- still be full under one of its limits (tokens, dollars, model calls): short of what
-- the run's next model call needs under the limit it parked at (ARGV[8], ARGV[9], as
-- CLAIM found it), or of any room at all under the others. The run would park again
-- at once, and the raise would say it went on when it did not.
--
-- KEYS[1] root's hash  KEYS[2] deadlines index  KEYS[3] pending index
-- KEYS[4] pending data  KEYS[5] outbox; then for each parked run: its hash, its inbox
-- ARGV[1..4] raise tokens, micro-dollars, model calls, deadline (ms) by; or ''
-- ARGV[5] root id  ARGV[6] due (ms)  ARGV[7] the pending member the raise answers, or ''
-- ARGV[8] the limit that run parked at (1 tokens, 2 micro-dollars, 3 model calls; ''
-- not known)  ARGV[9] what its next model call needs under it
-- then for each parked run: pending member, decision field, event JSON, advance member
-- Returns: {raised (1 if any limit was raised), runs woken}; {-1, 0} if no root;
-- {-2, 0} if the named entry is not pending; {-3, limit, used and held, the limit
-- after the raise, what is needed} if the tree would still be full under that limit.
--# totals
if redis.call('HEXISTS', KEYS[1], 'v') == 0 then return {-1, 0} end
if ARGV[7] ~= '' then
  if redis.call('HEXISTS', KEYS[4], ARGV[7]) == 0 then return {-2, 0} end
  -- limit, used, held: as CLAIM admits a model call against them
  local root = redis.call('HMGET', KEYS[1], 'lt', 'lu', 'lc', 'rt', 'ru', 'rc')
  local spent = totals({KEYS[1]}, {})
  root = {root[1], root[2], root[3], spent[3], spent[5], spent[6], root[4], root[5], root[6]}
  local int = function(x) return string.format('%d', x) end
  for i = 1, 3 do
    if root[i] then
      local cap = tonumber(root[i]) + tonumber(ARGV[i] ~= '' and ARGV[i] or '0')
      local used = tonumber(root[i + 3] or '0') + tonumber(root[i + 6] or '0')
      local need = ARGV[8] == tostring(i) and math.max(tonumber(ARGV[9]), 1) or 1
      if used + need > cap then return {-3, i, int(used), int(cap), int(need)} end
    end
  end
end
local raised = 0
local limits = {'lt', 'lu', 'lc', 'ld'}
for i, field in ipairs(limits) do
  if ARGV[i] ~= '' and redis.call('HEXISTS', KEYS[1], field) == 1 then
    local now = redis.call('HINCRBY', KEYS[1], field, ARGV[i])
    raised = 1
    if field == 'ld' then redis.call('ZADD', KEYS[2], now, ARGV[5]) end
  end
end
if raised == 0 then return {0, 0} end
local woken = 0
local parked = (#KEYS - 5) / 2
for k = 1, parked do
  local run, inbox = KEYS[4 + 2 * k], KEYS[5 + 2 * k]
  local member, field, event, advance = ARGV[6 + 4 * k], ARGV[7 + 4 * k],
    ARGV[8 + 4 * k], ARGV[9 + 4 * k]
  if redis.call('HEXISTS', KEYS[4], member) == 1 and redis.call('HEXISTS', run, 'v') == 1 then
    redis.call('ZREM', KEYS[3], member)
    redis.call('HDEL', KEYS[4], member)
    redis.call('HSET', run, field, 'decided')
    redis.call('XADD', inbox, '*', 'e', event)
    redis.call('ZADD', KEYS[5], ARGV[6], advance)
    woken = woken + 1
  end
end
return {raised, woken}
