--[[ schedule_upsert: create or redefine a recurring schedule by name, idempotently.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, stats:<minute>, schedule:<name>, schedules:refill, schedule_ran:<name>, schedules, dead:migrating, config, partitions, result:<id>, result_wait:<id>, flow:levels, flow:pdue:<p>, flow:ck:<key>, flow:ckheld:<key>, flow:rheld, flow:held, flow:waiting, flow:children:<id>, flow:ending, flow:ending:<word>:<id>
  ARGV[1] name   ARGV[2] digest (of the whole definition)   ARGV[3] kind ('cron' | 'every')
  ARGV[4] cron   ARGV[5] tz   ARGV[6] every_ms   ARGV[7] jitter_ms   ARGV[8] offset_ms
  ARGV[9] misfire (text)   ARGV[10] misfire_n (overdue slots that may run: 0 skip, 1, N)
  ARGV[11] task   ARGV[12] payload (JSON)   ARGV[13] max_attempts
  ARGV[14] backoff ('base_ms,factor,cap_ms,jitter')   ARGV[15] timeout_ms
  ARGV[16] flow ('' = none, else 'priority|ckey|climit|rkey|rate_count|rate_window_ms|' as
    enqueue's, without parents: scheduler/core/flow.py flow_field), stored on the schedule and
    given to every occurrence it inserts (lib/rearm.lua sched_insert)
  ARGV[17] start_within_ms ('' or absent = none; else 1 .. LIM.delay_ms): stored on the schedule;
    every occurrence it inserts gets the start deadline run_at + this (lib/rearm.lua sched_job)
  ARGV[18..] cron only: the next slots (ms, ascending) after now - offset_ms, from the client;
    when the pending occurrence is due (kept, below), also the latest missed slots after it
    (misfire_n + 1), so that its claim counts them for the misfire policy; when it waits and
    the new offset makes its slot overdue, that slot too if it is one of the new cron's
  Returns: {status, pending id or ''}; status 'unchanged' (same digest and its pending
    occurrence still waits, in due or set aside by flow control: nothing written), 'repaired'
    (same digest, but its pending occurrence had gone, e.g. cancelled by hand), 'created' or
    'updated' (the old pending occurrence is replaced by the first slot after now, and after
    the last slot that left due: ran_ms, lib/rearm.lua, or by its own slot, due at once, when
    the new offset makes that slot overdue and it is one of the new definition's (a cron
    one's: in ARGV[18..]); one already due and still waiting is
    kept, and the new definition applies from the slot after it; a starved schedule's owed
    run, waiting for a refill after a long outage, is placed from its cursor under the new
    definition, a cron one by that refill). A hash that cannot be read
    whole (hand-edited) is redefined ('updated'). A paused schedule stays paused. Exactly one
    pending occurrence afterwards (none if paused).
  Errors:  BAD_ARGUMENT <field>=<value>; CORRUPT <key> is not a <type> (a key edited by hand
    into another type: due, schedule:<name>, leased for a pending occurrence with a
    concurrency key, or dead or leased for one with waiting children, lib/rearm.lua sched_unpend);
    nothing written. The schedules index is
    advisory: one of another type is left as it is. ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/rearm.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix = KEYS[1]
local name, digest, kind = ARGV[1], ARGV[2], ARGV[3]
local err
if name == '' then return redis.error_reply('BAD_ARGUMENT name=') end
if digest == '' then return redis.error_reply('BAD_ARGUMENT digest=') end
if kind ~= 'cron' and kind ~= 'every' then return redis.error_reply('BAD_ARGUMENT kind=' .. kind) end
local every_ms, jitter_ms, offset_ms, misfire_n, max_attempts, timeout_ms
every_ms, err = int_arg(ARGV[6], 'every_ms', 0, LIM.delay_ms); if err then return err end
if kind == 'every' and every_ms < 1 then return redis.error_reply('BAD_ARGUMENT every_ms=0') end
jitter_ms, err = int_arg(ARGV[7], 'jitter_ms', 0, LIM.delay_ms); if err then return err end
offset_ms, err = int_arg(ARGV[8], 'offset_ms', 0, LIM.delay_ms); if err then return err end
misfire_n, err = int_arg(ARGV[10], 'misfire_n', 0, SCHED_CATCH_UP_MAX); if err then return err end
max_attempts, err = int_arg(ARGV[13], 'max_attempts', 1, LIM.attempts); if err then return err end
timeout_ms, err = int_arg(ARGV[15], 'timeout_ms', 0, LIM.timeout_ms); if err then return err end
if not schedule_name_ok(name) then return redis.error_reply('BAD_ARGUMENT name=') end
if not task_ok(ARGV[11]) then return redis.error_reply('BAD_ARGUMENT task=') end
if parse_backoff(ARGV[14]) == nil then
  return redis.error_reply('BAD_ARGUMENT backoff=' .. string.sub(ARGV[14], 1, 60))
end
local flow, bad_flow = flow_arg(ARGV[16] or '')
if flow == nil then return bad_flow end
if flow.after then return redis.error_reply('BAD_ARGUMENT after= (schedules take no parents)') end
local window = nil
if (ARGV[17] or '') ~= '' then
  window, err = int_arg(ARGV[17], 'start_within_ms', 1, LIM.delay_ms); if err then return err end
end
local slots
slots, err = int_args(18, 'slot', 0, LIM.time_ms); if err then return err end
if kind == 'cron' and #slots == 0 then return redis.error_reply('BAD_ARGUMENT slots=') end

err = partitioned_err(prefix)
if err then return err end
local now = now_ms()
local sk = sched_key(prefix, name)
local slots_key = sched_slots_key(prefix, name)
-- due is the truth of what runs: placing (or keeping) an occurrence needs it. Refused before
-- anything is written.
local bad = zset_err(prefix, 'due')
if bad then return bad end
local old = sched_load(prefix, name)
-- A schedule key of another type (sched_husk reads it as no hash): HSET would be refused.
if not old and not sched_husk(prefix, name) and redis.call('EXISTS', sk) == 1 then
  return corrupt_err('schedule:' .. name, 'hash')
end

local function store_slots()
  redis.call('DEL', slots_key)
  local adds = {}
  for _, v in ipairs(slots) do adds[#adds + 1] = v; adds[#adds + 1] = fmt(v) end
  for i = 1, #adds, 1000 do
    redis.call('ZADD', slots_key, unpack(adds, i, math.min(i + 999, #adds)))
  end
end

if old and redis.call('HGET', sk, 'digest') == digest then
  local starved = redis.call('HGET', sk, 'starved') == '1'
  if old.paused == '1' or starved or sched_waiting(prefix, old) then
    return { 'unchanged', old.pending }
  end
  bad = sched_unpend(prefix, old, now)
  if bad then return bad end
  if kind == 'cron' then store_slots() end
  sched_place(prefix, old, sched_from(old, now), 0, now)
  return { 'repaired', old.pending }
end

local status = 'created'
local paused = '0'
-- An occurrence already due and still waiting (no worker took it yet: a deploy restarting the
-- workers and the producer that redefines the schedule) is kept, and runs as it was placed,
-- under the misfire policy; the new definition applies from the slot after it. Withdrawn, the
-- run was lost whatever the policy (a daily one: a day without its run).
-- Due by the run's own time (sched_pending_at): a run kept before keeps the offset it was
-- placed with, whatever jitter the schedule stores since.
local waiting = old and old.paused ~= '1' and old.pending ~= '' and sched_waiting(prefix, old)
local keep = waiting and (sched_pending_at(prefix, old) or old.cursor_ms + old.offset_ms) <= now
  and old
-- A waiting run withdrawn before its own time: its slot, which the new definition may make
-- overdue (a smaller jitter), must not be skipped by placing from now (below).
local withdrawn = waiting and not keep and old.cursor_ms
-- A starved cron schedule (its buffer ran out before the run its misfire policy owes could be
-- placed: an outage longer than the buffer, lib/rearm.lua sched_place) still owes that run when
-- redefined (a deploy after the outage): placed from its cursor under the new definition, with
-- the budget recorded then. Placed from now, it was lost.
local owed = not keep and old and old.paused ~= '1' and old.pending == ''
  and redis.call('HGET', sk, 'starved') == '1' and { cursor_ms = old.cursor_ms,
    budget = parse_int(redis.call('HGET', sk, 'budget'), 0, LIM.attempts) or 0 }
old = old or sched_husk(prefix, name)
if old then
  status, paused = 'updated', old.paused or '0'
  if not keep then
    bad = sched_unpend(prefix, old, now)
    if bad then return bad end
  end
else
  redis.call('HSET', sk, 'created_ms', fmt(now))
  -- Removed earlier: its last slot that left due is kept (schedule_remove.lua), so no slot
  -- runs twice. pcall: a key of another type (written by hand) is ignored.
  local rk = prefix .. 'schedule_ran:' .. name
  local ran = parse_int(redis.pcall('GET', rk), 1, LIM.time_ms)
  if ran then redis.call('HSET', sk, 'ran_ms', fmt(ran)) end
  redis.pcall('DEL', rk)
end
redis.call('HSET', sk, 'name', name, 'digest', digest, 'kind', kind, 'cron', ARGV[4],
  'tz', ARGV[5], 'every_ms', fmt(every_ms), 'jitter_ms', fmt(jitter_ms),
  'offset_ms', fmt(offset_ms), 'misfire', ARGV[9], 'misfire_n', fmt(misfire_n),
  'task', ARGV[11], 'payload', ARGV[12], 'max_attempts', fmt(max_attempts),
  'backoff', ARGV[14], 'timeout_ms', fmt(timeout_ms),
  'paused', paused, 'pending', '', 'starved', '0', 'budget', 0, 'updated_ms', fmt(now))
redis.call('HDEL', sk, 'cursor_ms', 'start_within_ms', unpack(FLOW_READ))
if window then redis.call('HSET', sk, 'start_within_ms', fmt(window)) end
flow_store(sk, flow)
-- pcall: the schedules SET is an index for listing alone (list_schedules; no script reads it,
-- a schedule is found by its hash). One edited into another type already lists nothing, so
-- leaving this name out of it loses nothing more; refusing would stop the definition.
redis.pcall('SADD', prefix .. 'schedules', name)
redis.pcall('SREM', sched_refill_key(prefix), name)
redis.call('DEL', slots_key)
if kind == 'cron' then store_slots() end
if keep then
  redis.call('HSET', sk, 'pending', keep.pending, 'cursor_ms', fmt(keep.cursor_ms))
  return { status, keep.pending }
end
if owed and kind == 'cron' then
  -- The buffer just stored starts after now: the refill (asked for here, done by the next
  -- claim) computes the overdue slots too when the buffer is empty (cron_slots.refill_slots).
  redis.call('DEL', slots_key)
  redis.call('HSET', sk, 'cursor_ms', fmt(owed.cursor_ms), 'starved', '1', 'budget', owed.budget)
  redis.pcall('SADD', sched_refill_key(prefix), name)
  return { status, '' }
end
local h = sched_load(prefix, name)
if owed then
  sched_place(prefix, h, owed.cursor_ms, owed.budget, now)
elseif paused ~= '1' then
  local from = sched_from(h, now)
  -- The withdrawn run's slot at or before `from` (the new offset makes it overdue: a daily
  -- 09:00 run placed at 09:20 by its jitter, redefined at 09:10 without one) was skipped, a
  -- day without its run: it runs now instead, if it is a slot of the new definition (the client
  -- sends it in a cron buffer when it is) and none ran since.
  if withdrawn and withdrawn > h.ran_ms and withdrawn <= from
      and slot_after(prefix, h, withdrawn - 1) == withdrawn then
    sched_insert(prefix, h, withdrawn, now)
  else
    sched_place(prefix, h, from, 0, now)
  end
end
return { status, h.pending }
