--[[ cancel: withdraw a job that has not finished. A leased job's worker learns it at its next
  heartbeat, and its complete or fail is refused with 'cancelled'.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, stats:<minute>, schedule:<name>, schedules:refill, dead:migrating, config, result:<id>, result_wait:<id>, flow:levels, flow:pdue:<p>, flow:ck:<key>, flow:ckheld:<key>, flow:rheld, flow:held, flow:waiting, flow:children:<id>, flow:ending, flow:ending:<word>:<id>, finished, moving
  ARGV[1] id  ARGV[2] record_ttl_ms (how long the cancelled record, and its result wake-up
    `result:<id>` of lib/result.lua, are kept, unless the job has a result_ttl_ms of its own;
    its id is in the finished index as long)
  A schedule's pending occurrence is replaced by the schedule's next one, under its misfire
  policy (a late one: the missed runs the policy runs still run). A job set aside by
  flow control (flow:held) is cancelled as a due one. A cancelled job's payload is dropped,
  as a done one's is, unless it asked keep_payload (its spec record keeps the fields before it).
  Returns: the state before the call, in the words of docs/glossary.md and `jobs list --state`:
    'due' (waiting, run_at reached) | 'scheduled' (waiting, run_at later) | 'held' (set aside by
    flow control: parents not done, a concurrency key full, a rate window) | 'leased' (now
    cancelled), or 'done' | 'dead' | 'cancelled' (unchanged), or 'missing' (also a job being
    moved to another queue: in `moving`, scheduler queue move). A re-sent call
    answers 'cancelled' and changes nothing. (Before 'scheduled' and 'held', every waiting job
    answered 'due'.)
  Errors:  BAD_ARGUMENT <field>=<value>; CORRUPT due | leased | dead is not a zset (dead: for
    a job with waiting children; edited by hand into another type: nothing written) ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/rearm.lua"
-- @include "lib/result.lua"
-- @include "lib/flow.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, due, leased = KEYS[1], KEYS[2], KEYS[3]
local id = ARGV[1]
local ttl, err = int_arg(ARGV[2], 'record_ttl_ms', 1, LIM.ttl_ms)
if err then return err end
local jk = job_key(prefix, id)
local state, kids, own_ttl, kept = unpack(redis.call('HMGET', jk, 'state', 'kids',
  'result_ttl_ms', 'keep_payload'))
-- A job set aside by flow control (lib/flow.lua) is due too, only not in the due set. A
-- flow:held of another type (edited by hand) holds nothing.
local in_due = redis.pcall('ZSCORE', due, id)
if type(in_due) == 'table' then
  return corrupt_err('due', 'zset')
end
local held = false
if not in_due then
  in_due = redis.pcall('ZSCORE', prefix .. 'flow:held', id)
  if type(in_due) ~= 'string' then in_due = false end
  held = in_due and true
end
local in_leased = redis.pcall('ZSCORE', leased, id)
if type(in_leased) == 'table' then
  return corrupt_err('leased', 'zset')
end
-- A job never claimed has no hash yet: its spec and its place in due say it waits.
local fresh = not state
local pin = false  -- a never-claimed job's run time (its due score), written down below
local spec = false  -- its spec's fields, read from the record's head (no payload)
if fresh and in_due and redis.call('EXISTS', spec_key(prefix, id)) == 1 then
  pin = fmt(tonumber(in_due))
  state = 'due'
  spec = job_spec(prefix, id, in_due, true)
  if spec then own_ttl = spec.result_ttl_ms end
end
if not state then return 'missing' end
if not in_due and not in_leased then
  -- Being moved to another queue (admin/queue_move.py): not here to cancel, as a never
  -- claimed one in `moving` already answers; its state word would read as cancelled.
  if state == 'due' and type(redis.pcall('ZSCORE', prefix .. 'moving', id)) == 'string' then
    return 'missing'
  end
  -- In no place but waiting or running by its state (an orphan doctor reports): cancelled as
  -- asked, or doctor --fix would put it back in due and run it. Else its state as it is.
  if state ~= 'due' and state ~= 'leased' then return state end
end
local orphan = not in_due and not in_leased
-- Its waiting children are parked below (flow_parent_ended), after this script's first write.
if kids then
  local bad = dead_err(prefix)
  if bad then return bad end
end
local now = now_ms()
-- The job's own retention, as complete keeps a finished one (an unreadable one: the call's).
ttl = own_ttl and parse_int(own_ttl, 1, LIM.ttl_ms) or ttl
-- Cancelling a schedule's pending occurrence cancels that run, not the schedule: the next
-- occurrence takes its place in the same step (exactly one pending, as lib/rearm.lua keeps it).
local schedule = redis.call('HGET', jk, 'schedule')
if schedule and in_due then sched_ended(prefix, schedule, id, now) end
redis.call('ZREM', due, id)
redis.call('ZREM', leased, id)
-- Out of the flow holds, and a leased job's key slot is free (its held jobs may run).
flow_forget(prefix, id, now)
flow_parent_ended(prefix, id, 'cancelled', now)
redis.call('HSET', jk, 'state', 'cancelled', 'finished_ms', fmt(now))
if fresh then redis.call('HSET', jk, 'attempts', '0') else redis.call('HDEL', jk, 'worker') end
-- Finished, as a done job is: its payload goes unless it asked to keep it (complete's lean
-- record). Nothing reads it again: no requeue, rerun or move takes a cancelled job. The spec
-- record's head stays (status, get_job, the retention); a job with no spec (a schedule's run,
-- an older version's) has its payload in its hash.
if kept ~= '1' then
  redis.call('HDEL', jk, 'payload')
  spec_drop_payload(prefix, id)
end
if pin then
  -- Its run time and enqueue time written down, as lib/job.lua pin_unclaimed does for a parked
  -- job, which may be claimed again; a cancelled one is not: its record (a kept payload with
  -- it) is not read whole and written back for it, its hash holds enqueued_ms (as a claimed
  -- job's).
  if spec then redis.call('HSET', jk, 'enqueued_ms', spec.enqueued_ms) end
  if redis.call('HEXISTS', jk, 'run_at_ms') == 0 then redis.call('HSET', jk, 'run_at_ms', pin) end
end
job_expire(prefix, id, ttl)
result_wake(prefix, id, 'cancelled', ttl)
finished_add(prefix, now, { now + ttl, id })
bump_stat(prefix, now, 'cancel', 1)
if in_leased then return 'leased' end
if orphan then return state end
if held then return 'held' end
-- in_due is its run_at (a ZSCORE's text): later than now, it was scheduled.
if (tonumber(in_due) or 0) > now then return 'scheduled' end
return 'due'
