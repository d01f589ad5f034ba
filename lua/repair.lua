--[[ repair: doctor --fix's job moves, made by the same lib/job.lua moves as the transitions,
  so a repair and a claim park a job identically. Sent by scheduler/admin/doctor.py inside its
  WATCH/MULTI (it re-read the job first), with doctor's server-time reading as now.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, stats:<minute>, schedule:<name>, schedules:refill, dead:migrating, config
  ARGV[1] move   'dead': park the job (dead_letter) with ARGV[3] reason at ARGV[4] now_ms
  ARGV[2] id
  Returns: 1. Parking a schedule's pending occurrence arms its next one (as claim does).
  Errors:  BAD_ARGUMENT <field>=<value> ]]
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/rearm.lua"

local prefix = KEYS[1]
local move, id, reason = ARGV[1], ARGV[2], ARGV[3]
if not job_id_ok(id) then return redis.error_reply('BAD_ARGUMENT id=') end
if move ~= 'dead' then return redis.error_reply('BAD_ARGUMENT move=' .. tostring(move)) end
if type(reason) ~= 'string' or reason == '' or #reason > 200 then
  return redis.error_reply('BAD_ARGUMENT reason=')
end
local now, err = int_arg(ARGV[4], 'now_ms', 0, LIM.time_ms)
if err then return err end
-- As claim's park: a schedule's pending occurrence parked here arms the schedule's next one.
local name = redis.pcall('HGET', job_key(prefix, id), 'schedule')
if not schedule_name_ok(name) then name = string.match(id, '^schedule:([%w_.%-]+):%d+$') end
if name then sched_ended(prefix, name, id, now) end
dead_letter(prefix, id, reason, now)
return 1
