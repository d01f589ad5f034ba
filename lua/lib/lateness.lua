-- Start lateness per minute: how long after its run time each claimed job was leased, kept in
-- the minute's stats:<minute> hash next to the outcome counters (lib/util.lua bump_stat, same
-- key and 2 h expiry). Read by the dashboard's lateness chart (scheduler/operations/browsing.py
-- lateness_series), so the history outlives any dashboard process. Fields (not outcome
-- counters, so not in core/vocabulary.py STAT_FIELDS):
--   late_n        jobs claimed          late_sum_ms   their lateness summed (mean = sum / n)
--   late_max_ms   the largest           late_le_<ms>, late_gt_600000   a histogram (p99)
-- Written once per claim call, not per job: the reply's jobs are tallied in Lua, then at most
-- 2 + 7 HINCRBY, one HGET (+ HSET) and one PEXPIRE. Advisory (pcall), like bump_stat: a hand-
-- edited field must not fail a claim after its writes.
-- Needs lib/util.lua (fmt) and lib/job.lua (CLAIM_FIELDS).

local LATE_BOUNDS_MS = { 10, 100, 1000, 10000, 60000, 600000 }
local LATE_OVER = 'late_gt_600000'
-- 'late_le_<ms>' per bound, written out (not built per job); test_lua_layout checks they agree.
local LATE_FIELDS = { 'late_le_10', 'late_le_100', 'late_le_1000', 'late_le_10000',
  'late_le_60000', 'late_le_600000' }

-- `out` is claim's packed reply (lib/job.lua pack_job: CLAIM_FIELDS per job, run_at_ms the 7th).
local function record_lateness(prefix, now, out)
  local n = #out / CLAIM_FIELDS
  if n < 1 then return end
  local per, sum, max = {}, 0, 0
  for i = 0, n - 1 do
    local late = now - (tonumber(out[i * CLAIM_FIELDS + 7]) or now)
    if late < 0 then late = 0 end  -- a run time after now (a clock step): on time
    sum = sum + late
    if late > max then max = late end
    local field = LATE_OVER
    for b, bound in ipairs(LATE_BOUNDS_MS) do
      if late <= bound then field = LATE_FIELDS[b]; break end
    end
    per[field] = (per[field] or 0) + 1
  end
  local k = prefix .. 'stats:' .. fmt(math.floor(now / 60000))
  redis.pcall('HINCRBY', k, 'late_n', n)
  redis.pcall('HINCRBY', k, 'late_sum_ms', fmt(sum))
  for _, field in ipairs(LATE_FIELDS) do  -- a fixed order: the script's effects replay alike
    if per[field] then redis.pcall('HINCRBY', k, field, per[field]) end
  end
  if per[LATE_OVER] then redis.pcall('HINCRBY', k, LATE_OVER, per[LATE_OVER]) end
  local old = tonumber(redis.pcall('HGET', k, 'late_max_ms'))  -- an error reply reads as nil
  if old == nil or max > old then redis.pcall('HSET', k, 'late_max_ms', fmt(max)) end
  redis.pcall('PEXPIRE', k, 7200000)
end
