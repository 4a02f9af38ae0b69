-- TOTALS: what a run and its descendants used, as SAVE adds it up (included by CLAIM,
-- EXTEND and SAVE: `--# totals`; never called alone).
--
-- Kept in one field, `u` ("tokens in, out, total, cached in, micro-dollars, model
-- calls, unpriced calls": RunFields.TOTALS), since each field of a run's hash costs
-- about 50 bytes and a parked run is mostly its hash. A run saved before keeps them in
-- seven fields (`tp` `tc` `tt` `cc` `cu` `mc` `np`, any absent being 0), which its next
-- usage moves into `u`.
--
-- KEYS[1] run hash
-- Returns: the seven numbers, and whether they are still in the seven fields.
local packed = redis.call('HGET', KEYS[1], 'u')
local totals = {}
if packed then
  for number in string.gmatch(packed, '%-?%d+') do totals[#totals + 1] = tonumber(number) end
  for i = #totals + 1, 7 do totals[i] = 0 end
  return totals, false
end
local fields = redis.call('HMGET', KEYS[1], 'tp', 'tc', 'tt', 'cc', 'cu', 'mc', 'np')
local apart = false
for i = 1, 7 do
  totals[i] = tonumber(fields[i] or '0') or 0
  apart = apart or fields[i] ~= false
end
return totals, apart
