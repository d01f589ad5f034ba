--[[ schedule_run: run a schedule once now, beside its slots (an operator's "run now"): one job
  due now with the schedule's task, payload, max_attempts, backoff, timeout_ms and flow options,
  and, when the schedule has a start_within_ms, the start deadline now + that, written as its
  occurrences are (lib/rearm.lua sched_job: a hash whose `schedule` field names
  it; no `slot_ms`: it is no slot of the schedule). The schedule is read and the job written in
  this one call, so a concurrent remove or redefinition comes wholly before or after it. The
  schedule itself is not written: its pending occurrence, next slot, paused flag and ran_ms stay
  as they are (a paused schedule runs now too, and stays paused). claim runs the job as any job
  naming a schedule that is not its pending occurrence (lib/rearm.lua sched_rearm: nothing is
  re-armed); pause and remove leave it (it is withdrawn by cancelling it, by id).
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, schedule:<name>, config, partitions, flow:levels, flow:pdue:<p>
  ARGV[1] name  ARGV[2] the job's id (made by the client, so a re-sent call finds it; not a
    `schedule:` id: those are the occurrences')
  Returns: {status, id or ''}: 'created' | 'exists' (a job with that id is there already, e.g.
    this call re-sent after its reply was lost: nothing written) | 'missing' (no schedule of
    that name: nothing written) | 'unreadable' (a schedule key lib/schedule.lua sched_load
    cannot read whole, or of another type, edited by hand: nothing written)
  Errors:  BAD_ARGUMENT id=<id> | queue=<name> is partitioned; CORRUPT due is not a zset
    (edited by hand into another type); nothing written ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/rearm.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, name, id = KEYS[1], ARGV[1], ARGV[2]
-- Schedules' occurrences only (lib/rearm.lua): one made here would be taken over by its slot.
if not job_id_ok(id) or string.find(id, '^schedule:') then
  return redis.error_reply('BAD_ARGUMENT id=' .. string.sub(tostring(id), 1, 40))
end
local err = partitioned_err(prefix)
if err then return err end
local h = sched_load(prefix, name)
if h == nil then
  if redis.call('EXISTS', sched_key(prefix, name)) == 1 then return { 'unreadable', '' } end
  return { 'missing', '' }
end
if job_exists(prefix, id) then return { 'exists', id } end
local bad = zset_err(prefix, 'due')
if bad then return bad end
local now = now_ms()
sched_job(prefix, h, id, now, nil, now)
-- Due now: idle workers may sleep towards a later job, or none.
wake(KEYS[5])
return { 'created', id }
