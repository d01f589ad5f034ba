--[[ reschedule: move a waiting job's run time (a reminder moved to 10:00; "run it now"). Only
  a job in due moves (scheduled, due, or waiting out a retry's backoff); its attempts, token
  and payload stay. Not a schedule's pending run (the one its schedule arms for a slot and
  withdraws at a pause or a redefinition: redefine or pause the schedule instead); a run
  already claimed (waiting out a retry: the schedule armed its next) and run_schedule_now's
  extra run are jobs of their own and move. Not a job flow control holds (a key or rate
  limit, or parents not done: it runs when let go). An idempotency key keeps the window it got at enqueue; a start
  deadline (lib/job.lua spec_flags) moves by as much as the run time does. A job of a
  concurrency key moved later promotes its key's held jobs into a free slot (it may have been
  let out of the key's hold for that slot).
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, schedule:<name>, config, flow:levels, flow:pdue:<p>, flow:ck:<key>, flow:ckheld:<key>, flow:held
  ARGV[1] id  ARGV[2] when ('at' | 'in' | 'now')  ARGV[3] time_ms (run_at_ms for 'at', a past
    one taken as now; for 'in', a delay from the server's now; for 'now', ignored: the server's
    now, for a job due later only)
  Returns: {'rescheduled', run_at_ms} | {word}: the job did not move, word = 'schedule' (a
    schedule's pending run, or a run whose schedule key is of another type), 'held' (set aside
    by flow control), its state ('leased', 'done', 'dead', 'cancelled'; 'due' for 'now': due
    already, it keeps its place), or 'missing'.
  Errors:  BAD_ARGUMENT <field>=<value>; CORRUPT due | leased (a job of a concurrency key moved
    later) is not a zset | job:<id> is not a hash
    (edited by hand; nothing written) ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/flow.lua"
-- @include "lib/schedule.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, due, wake_key = KEYS[1], KEYS[2], KEYS[5]
local id, when = ARGV[1], ARGV[2]
if id == '' or #id > 1024 then return redis.error_reply('BAD_ARGUMENT id=') end
local now = now_ms()
local run_at, err
if when == 'in' then
  run_at, err = int_arg(ARGV[3], 'time_ms', 0, LIM.delay_ms); if err then return err end
  run_at = now + run_at
elseif when == 'now' then
  run_at = now
elseif when == 'at' then
  run_at, err = int_arg(ARGV[3], 'time_ms', 0, LIM.time_ms); if err then return err end
  -- A past time is due now, and stored as now: a start window then counts from now, and the
  -- next move shifts it from there (kept as the past time, a second move widened the window
  -- by how far in the past it was).
  if run_at < now then run_at = now end
else
  return redis.error_reply('BAD_ARGUMENT when=' .. string.sub(when, 1, 40))
end
if run_at > LIM.time_ms then return redis.error_reply('BAD_ARGUMENT time_ms=' .. fmt(run_at)) end

local jk = job_key(prefix, id)
local f = redis.pcall('HMGET', jk, 'state', 'schedule', 'priority', 'ckey')
if f.err then return corrupt_err(string.sub(jk, #prefix + 1), 'hash') end
local score = redis.pcall('ZSCORE', due, id)
if type(score) == 'table' then return corrupt_err('due', 'zset') end
if not score then
  local held = redis.pcall('ZSCORE', prefix .. 'flow:held', id)
  if type(held) == 'string' then return { 'held' } end
  if f[1] then return { f[1] } end
  return { 'missing' }
end
-- A schedule's pending run keeps its slot's time (the schedule's pause and redefinition find it
-- by `pending`); its run claimed once, or run_schedule_now's, is no longer that run.
local sname = string.match(id, '^schedule:([%w_.%-]+):%d+$')
if not sname and schedule_name_ok(f[2]) then sname = f[2] end
if sname then
  local pending = redis.pcall('HGET', sched_key(prefix, sname), 'pending')
  if type(pending) == 'table' or pending == id then return { 'schedule' } end
end
-- A job in due with neither a hash nor a spec record is a stray id: doctor's to report.
if not f[1] and redis.call('EXISTS', spec_key(prefix, id)) == 0 then return { 'missing' } end

if when == 'now' and tonumber(score) <= now then return { 'due' } end
-- A job of a concurrency key moved later passes on a free slot it was let out of its key's
-- hold for (below); that reads the key's leases in leased: checked before the first write.
local passes = f[4] and run_at > now
if passes then
  local bad = zset_err(prefix, 'leased')
  if bad then return bad end
end
local head = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
local run_at_s = fmt(run_at)
if not f[1] then spec_pin_enqueued(prefix, id, fmt(tonumber(score))) end
-- A start deadline moves with the run time: the job keeps the window it was given (a score
-- that is no time, edited by hand, moves nothing).
local was = tonumber(score)
if was >= 0 and was <= LIM.time_ms then spec_move_deadline(prefix, id, run_at - math.floor(was)) end
redis.call('ZADD', due, 'XX', run_at_s, id)
-- A job with a hash (claimed before, or a flow job) reads its run time from it at claim.
if f[1] then redis.call('HSET', jk, 'run_at_ms', run_at_s) end
local priority = parse_int(f[3], 0, FLOW_LIM.priority)
if priority then flow_index(prefix, id, priority, run_at) end
-- Let out of its key's hold when a lease of the key ended, it would take that free slot with
-- it until its new time, the key's other held jobs waiting with nothing leased.
if passes then flow_release(prefix, id, now) end
-- Earlier than every job idle workers sleep towards: wake them.
if run_at <= now or (head[2] and run_at < tonumber(head[2])) then wake(wake_key) end
return { 'rescheduled', run_at_s }
