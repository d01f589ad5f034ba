-- Recurring schedules: keep exactly one pending occurrence per schedule.
-- Needs lib/util.lua (fmt, wake, bump_stat, parse_int, LIM) included before it.
--
-- A slot is a nominal occurrence time in ms; its job is '<name>' slot id, due at slot + offset_ms
-- (the schedule's stable jitter). Interval ('every') schedules compute slots here, aligned to the
-- epoch. Lua cannot evaluate cron, so cron schedules read their slots from a buffer ZSET the
-- client fills (schedule_upsert / schedule_resume / schedule_refill); when the buffer runs low,
-- the schedule's name goes into the refill SET, and every claim reply says whether that SET is
-- non-empty, so the claiming client refills it (idempotently) on the same call.
--
-- Schedule hash fields read here: kind, every_ms, offset_ms, misfire_n (how many overdue slots
-- may run: 0 skip, 1 run once, N catch up), paused, pending (the id of the one occurrence in
-- due, '' when none), cursor_ms (slot of the pending occurrence, or the last one placed),
-- task, payload, max_attempts, backoff, timeout_ms.

local SCHED_BUFFER_LOW = 16
local SCHED_DROP_TTL_MS = 3600000
local SCHED_FIELDS = { 'kind', 'every_ms', 'offset_ms', 'misfire_n', 'paused', 'pending',
  'cursor_ms', 'task', 'payload', 'max_attempts', 'backoff', 'timeout_ms' }

local function sched_key(prefix, name) return prefix .. 'schedule:' .. name end
local function sched_slots_key(prefix, name) return prefix .. 'schedule:' .. name .. ':slots' end
local function sched_refill_key(prefix) return prefix .. 'schedules:refill' end
local function occurrence_id(name, slot) return 'schedule:' .. name .. ':' .. fmt(slot) end

local function sched_load(prefix, name)
  -- pcall: a schedule key overwritten with another type must not fail every claim.
  local v = redis.pcall('HMGET', sched_key(prefix, name), unpack(SCHED_FIELDS))
  if v.err or not v[1] then return nil end
  local h = { name = name }
  for i, f in ipairs(SCHED_FIELDS) do h[f] = v[i] end
  -- Read strictly: a hand-edited every_ms of 0 or 'inf' would put slot 'inf' into due. A
  -- schedule whose numbers cannot be read is treated as absent (doctor reports it).
  if h.kind ~= 'every' and h.kind ~= 'cron' then return nil end
  h.every_ms = parse_int(h.every_ms or '0', 0, LIM.delay_ms)
  h.offset_ms = parse_int(h.offset_ms or '0', 0, LIM.delay_ms)
  h.misfire_n = parse_int(h.misfire_n or '1', 0, LIM.attempts)
  h.cursor_ms = parse_int(h.cursor_ms or '0', 0, LIM.time_ms)
  if h.every_ms == nil or h.offset_ms == nil or h.misfire_n == nil or h.cursor_ms == nil
    or (h.kind == 'every' and h.every_ms < 1) then
    return nil
  end
  h.pending = h.pending or ''
  return h
end

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

-- Insert the occurrence for `slot` (idempotent on its id) and make it the pending one.
local function sched_insert(prefix, h, slot, now)
  local id = occurrence_id(h.name, slot)
  local jk = prefix .. 'job:' .. id
  -- An id that exists and is not waiting in due already ran (a definition change moved the
  -- cursor back): never run a slot twice, take the one after it.
  local guard = 0
  while redis.call('EXISTS', jk) == 1 and redis.pcall('HGET', jk, 'state') ~= 'due' do
    local later = slot_after(prefix, h, slot)
    guard = guard + 1
    if later == nil or guard > 100 then return nil end
    slot = later
    id = occurrence_id(h.name, slot)
    jk = prefix .. 'job:' .. id
  end
  if redis.call('EXISTS', jk) == 0 then
    local run_at = slot + h.offset_ms
    local due = prefix .. 'due'
    local head = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
    redis.call('HSET', jk, 'task', h.task, 'payload', h.payload, 'state', 'due',
      'run_at_ms', fmt(run_at), 'enqueued_ms', fmt(now), 'attempts', 0,
      'max_attempts', h.max_attempts, 'backoff', h.backoff, 'schedule', h.name,
      'slot_ms', fmt(slot))
    if (parse_int(h.timeout_ms, 1, LIM.timeout_ms) or 0) > 0 then
      redis.call('HSET', jk, 'timeout_ms', h.timeout_ms)
    end
    redis.call('ZADD', due, run_at, id)
    if not head[2] or run_at < tonumber(head[2]) then wake(prefix .. 'wake') end
  end
  redis.call('HSET', sched_key(prefix, h.name), 'pending', id, 'cursor_ms', fmt(slot),
    'starved', '0')
  h.pending, h.cursor_ms = id, slot
  if h.kind == 'cron' then
    local sk = sched_slots_key(prefix, h.name)
    redis.call('ZREMRANGEBYSCORE', sk, '-inf', fmt(slot))
    if redis.call('ZCARD', sk) < SCHED_BUFFER_LOW then
      redis.pcall('SADD', sched_refill_key(prefix), h.name)
    end
  end
  return id
end

-- Make the occurrence that follows slot `after` pending, under the misfire policy: at most
-- `budget` of the slots already overdue (slot + offset <= now) may still run, the latest ones.
-- Returns the id, or nil when the cron buffer does not reach past now (the schedule is then
-- marked starved and queued for a refill, which calls this again with the same budget).
local function sched_place(prefix, h, after, budget, now)
  local eff = now - h.offset_ms
  local m = slots_between(prefix, h, after, eff)
  local slot
  if m <= budget then slot = slot_after(prefix, h, after)
  elseif budget == 0 then slot = slot_after(prefix, h, eff)
  else slot = slot_back(prefix, h, eff, budget) end
  if h.kind == 'cron' and (slot == nil or slot_after(prefix, h, eff) == nil) then
    redis.call('HSET', sched_key(prefix, h.name), 'pending', '', 'cursor_ms', fmt(after),
      'budget', budget, 'starved', '1')
    redis.pcall('SADD', sched_refill_key(prefix), h.name)
    h.pending = ''
    return nil
  end
  return sched_insert(prefix, h, slot, now)
end

-- Remove the pending occurrence if it is still waiting in due (pause, remove, redefine).
local function sched_unpend(prefix, h)
  if h.pending == '' then return end
  local jk = prefix .. 'job:' .. h.pending
  if redis.call('HGET', jk, 'state') == 'due' then
    redis.call('ZREM', prefix .. 'due', h.pending)
    redis.call('DEL', jk)
  end
  redis.call('HSET', sched_key(prefix, h.name), 'pending', '')
  h.pending = ''
end

-- Called by claim for a due job that names a schedule, in the same script, before leasing it.
-- When it is the schedule's pending occurrence, the next one is inserted right here, so a
-- worker dying at any later point can neither skip nor double a run. A retry, or an occurrence
-- of a removed or redefined schedule, is simply run. Returns false when the misfire policy
-- drops this late occurrence (it is then marked cancelled with skipped='misfire', not leased).
local function sched_rearm(prefix, name, id, now)
  local h = sched_load(prefix, name)
  if h == nil or h.pending ~= id then return true end
  local cur = h.cursor_ms
  local n = h.misfire_n
  -- Overdue slots after this one: the runs missed while nothing claimed.
  local m = slots_between(prefix, h, cur, now - h.offset_ms)
  local run = (m == 0) or (m < n)
  local budget = n
  if run then budget = math.max(n - 1, 0) end
  if not run then
    local jk = prefix .. 'job:' .. id
    redis.call('ZREM', prefix .. 'due', id)
    redis.call('HSET', jk, 'state', 'cancelled', 'skipped', 'misfire', 'finished_ms', fmt(now))
    redis.call('PEXPIRE', jk, SCHED_DROP_TTL_MS)
    bump_stat(prefix, now, 'misfire_skip', 1)
  end
  sched_place(prefix, h, cur, budget, now)
  return run
end

-- The pending occurrence `id` of schedule `name` ended without running (parked by claim or by
-- hand, purged): arm the next one, as cancel does, so the schedule goes on. Anything else (a
-- retry, a run that already re-armed at claim, a paused or removed schedule) changes nothing.
local function sched_ended(prefix, name, id, now)
  local h = sched_load(prefix, name)
  if h == nil or h.pending ~= id or h.paused == '1' then return end
  sched_place(prefix, h, h.cursor_ms, 0, now)
end
