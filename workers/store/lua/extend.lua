-- EXTEND: raise a tree's budget and let the runs parked at it go on.
--
-- Each limit the tree has (`lt` tokens, `lu` micro-dollars, `lc` model calls, `ld`
-- the deadline) is raised by the amount given; a limit the tree never had stays
-- unlimited. Each run still parked at the budget (its pending entry named in ARGV)
-- is decided once, like an approval: the entry goes, the run's inbox gets a
-- BudgetExtended event, and the run is woken. A raise that raises no limit the tree
-- has wakes nobody: the runs would only park again, and the caller is told so.
--
-- KEYS[1] root's hash  KEYS[2] deadlines index  KEYS[3] pending index
-- KEYS[4] pending data  KEYS[5] outbox; then for each parked run: its hash, its inbox
-- ARGV[1..4] raise tokens, micro-dollars, model calls, deadline (ms) by; or ''
-- ARGV[5] root id  ARGV[6] due (ms); then for each parked run: pending member,
-- decision field, event JSON, advance member
-- Returns: {raised (1 if any limit was raised), runs woken}, or {-1, 0} if no root.
if redis.call('HEXISTS', KEYS[1], 'v') == 0 then return {-1, 0} end
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
  local member, field, event, advance = ARGV[3 + 4 * k], ARGV[4 + 4 * k],
    ARGV[5 + 4 * k], ARGV[6 + 4 * k]
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
