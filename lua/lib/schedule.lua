-- Recurring schedules: key names, the fields stored per schedule, and the strict loader.
-- Part of the schedule library (lib/rearm.lua includes it); see lib/rearm.lua for the model.
-- @include "lib/util.lua"
-- @include "lib/job.lua"

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
