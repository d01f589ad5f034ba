-- Recurring schedules: key names, the fields stored per schedule, and the strict loader.
-- Part of the schedule library (lib/rearm.lua includes it); see lib/rearm.lua for the model.
-- @include "lib/util.lua"
-- @include "lib/job.lua"

local SCHED_BUFFER_LOW = 16
local SCHED_DROP_TTL_MS = 3600000
-- How long a removed schedule's last run is remembered (schedule_ran:<name>): a month.
local SCHED_RAN_KEEP_MS = 2678400000
-- Claims of one stale pending slot that wait for its refill (lib/rearm.lua sched_rearm): each
-- refills at least 20 schedules, so 50 cover 1,000 starved at once.
local SCHED_DEFER_MOST = 50
-- catch_up:N's largest N (scheduler/schedules MAX_CATCH_UP): a hand-edited misfire_n above it
-- reads as it, so no refill computes more overdue slots than the policy allows.
local SCHED_CATCH_UP_MAX = 1000
local SCHED_FIELDS = { 'kind', 'every_ms', 'offset_ms', 'misfire_n', 'paused', 'pending',
  'cursor_ms', 'task', 'payload', 'max_attempts', 'backoff', 'timeout_ms', 'ran_ms',
  'start_within_ms' }

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
  -- Read strictly: a hand-edited every_ms of 0 or 'inf' would put slot 'inf' into due, a
  -- missing task would make sched_insert write `false` (a script error inside claim, on every
  -- claim). A schedule that cannot be read whole is treated as absent: claim runs its pending
  -- occurrence without re-arming; remove, pause and a redefinition still clear it (sched_husk).
  if h.kind ~= 'every' and h.kind ~= 'cron' then return nil end
  if not task_ok(h.task) or type(h.payload) ~= 'string'
    or not parse_int(h.max_attempts, 1, LIM.attempts)
    or not (h.backoff == '' or parse_backoff(h.backoff)) then
    return nil
  end
  h.every_ms = parse_int(h.every_ms or '0', 0, LIM.delay_ms)
  h.offset_ms = parse_int(h.offset_ms or '0', 0, LIM.delay_ms)
  h.misfire_n = parse_int(h.misfire_n or '1', 0, LIM.attempts)
  h.cursor_ms = parse_int(h.cursor_ms or '0', 0, LIM.time_ms)
  -- Each occurrence's start window (schedule_upsert's start_within_ms); none when absent (a
  -- schedule defined before it existed), unreadable when edited into anything else.
  local window = h.start_within_ms
  h.start_within_ms = window and parse_int(window, 1, LIM.delay_ms)
  if h.every_ms == nil or h.offset_ms == nil or h.misfire_n == nil or h.cursor_ms == nil
    or (h.kind == 'every' and h.every_ms < 1) or (window and not h.start_within_ms) then
    return nil
  end
  h.misfire_n = math.min(h.misfire_n, SCHED_CATCH_UP_MAX)
  -- The slot of the last occurrence that left due by claim, park or cancel (lib/rearm.lua
  -- sched_place): a guard only, so a hand-edited value reads as none.
  h.ran_ms = parse_int(h.ran_ms or '0', 0, LIM.time_ms) or 0
  h.pending = h.pending or ''
  return h
end

-- What a schedule hash sched_load cannot read still says (remove, pause and a redefinition
-- clear it): its pending occurrence and paused flag. nil when there is no hash of that name.
local function sched_husk(prefix, name)
  local sk = sched_key(prefix, name)
  local v = redis.pcall('HMGET', sk, 'pending', 'paused')
  if v.err or redis.call('EXISTS', sk) == 0 then return nil end
  local pending = v[1]
  if not job_id_ok(pending) then pending = '' end
  return { name = name, pending = pending, paused = (v[2] == '1') and '1' or '0' }
end
