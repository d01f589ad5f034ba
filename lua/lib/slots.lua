-- Recurring schedules: slot arithmetic (interval slots computed here, cron slots read from the
-- client-filled buffer ZSET). Part of the schedule library (lib/rearm.lua includes it).
-- @include "lib/schedule.lua"

-- The first slot strictly after t; nil when the cron buffer does not reach past t.
local function slot_after(prefix, h, t)
  if h.kind == 'every' then return (math.floor(t / h.every_ms) + 1) * h.every_ms end
  local r = redis.pcall('ZRANGE', sched_slots_key(prefix, h.name), '(' .. fmt(t), '+inf',
    'BYSCORE', 'LIMIT', 0, 1)
  if r.err then return nil end
  if r[1] then return parse_int(r[1], 0, LIM.time_ms) end
  return nil
end

-- How many slots lie in (after, upto].
local function slots_between(prefix, h, after, upto)
  if upto <= after then return 0 end
  if h.kind == 'every' then
    return math.floor(upto / h.every_ms) - math.floor(after / h.every_ms)
  end
  local c = redis.pcall('ZCOUNT', sched_slots_key(prefix, h.name), '(' .. fmt(after), fmt(upto))
  if type(c) ~= 'number' then return 0 end
  return c
end

-- The i-th latest slot <= upto (i >= 1).
local function slot_back(prefix, h, upto, i)
  if h.kind == 'every' then return (math.floor(upto / h.every_ms) - (i - 1)) * h.every_ms end
  local r = redis.pcall('ZRANGE', sched_slots_key(prefix, h.name), fmt(upto), '-inf', 'BYSCORE',
    'REV', 'LIMIT', i - 1, 1)
  if r.err then return nil end
  return parse_int(r[1], 0, LIM.time_ms)
end
