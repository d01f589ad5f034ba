-- Recurring schedules: keep exactly one pending occurrence per schedule.
-- Needs lib/util.lua, lib/job.lua, lib/schedule.lua and lib/slots.lua (included below).
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
-- ran_ms (slot of the last due occurrence that left due by claim, park or cancel: no placing goes
-- back to it, whatever the definition; kept by a redefinition), deferred_ms and deferrals (the
-- pending slot whose claims waited for a refill, and how many times: sched_rearm), task,
-- payload, max_attempts, backoff, timeout_ms, start_within_ms (each occurrence's start window,
-- none when absent); and the flow fields of every occurrence (priority, ckey, climit, rkey,
-- rcount, rwindow: lib/flow.lua, read with flow_load).

-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/schedule.lua"
-- @include "lib/slots.lua"
-- @include "lib/flow.lua"

-- Placing occurrences: insert, place under the misfire policy, unpend, re-arm at claim, end.

-- Write job `id` of schedule `h`, due at `run_at`, as every run of a schedule is written: a
-- hash (no spec record) with the schedule's task, payload, max_attempts, backoff, timeout_ms,
-- start deadline (start_by_ms = run_at + start_within_ms, when the schedule has one) and flow
-- options, its `schedule` field naming it; into due. `slot`: the occurrence's slot
-- (`slot_ms`), nil for a run now (schedule_run.lua: one extra run, no slot of the schedule).
-- The caller checked that due is a ZSET and that `id` is free. Returns whether it is due before
-- every job that waited (the caller wakes idle workers then).
local function sched_job(prefix, h, id, run_at, slot, now)
  local jk = job_key(prefix, id)
  local due = prefix .. 'due'
  local head = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
  local fields = { 'task', h.task, 'payload', h.payload, 'state', 'due',
    'run_at_ms', fmt(run_at), 'enqueued_ms', fmt(now), 'attempts', 0,
    'max_attempts', h.max_attempts, 'backoff', h.backoff, 'schedule', h.name }
  if slot then
    fields[#fields + 1] = 'slot_ms'
    fields[#fields + 1] = fmt(slot)
  end
  if (parse_int(h.timeout_ms, 1, LIM.timeout_ms) or 0) > 0 then
    fields[#fields + 1] = 'timeout_ms'
    fields[#fields + 1] = h.timeout_ms
  end
  -- The schedule's start window makes this run's start deadline, as an enqueued job's
  -- (enqueue.lua 'w'); a hash has no spec flags, so it is a field of its own: claim parks the
  -- run, not starts it, after it (claim.lua).
  if h.start_within_ms then
    fields[#fields + 1] = 'start_by_ms'
    fields[#fields + 1] = fmt(math.min(run_at + h.start_within_ms, LIM.time_ms))
  end
  redis.call('HSET', jk, unpack(fields))
  redis.call('ZADD', due, run_at, id)
  -- The schedule's flow options go on each of its runs, so claim treats it like an enqueued
  -- job with them: the priority index, key limits with hold, the rate window.
  local f = flow_load(sched_key(prefix, h.name))
  if flow_used(f) then
    flow_store(jk, f)
    flow_index(prefix, id, f.priority, run_at)
  end
  return not head[2] or run_at < tonumber(head[2])
end

-- Insert the occurrence for `slot` (idempotent on its id) and make it the pending one.
local function sched_insert(prefix, h, slot, now)
  local id = occurrence_id(h.name, slot)
  local jk = job_key(prefix, id)
  -- An id that exists and is not waiting in due already ran (a definition change moved the
  -- cursor back): never run a slot twice, take the one after it. One waiting in due that was
  -- claimed before (a fence) is a retry or a requeued run, e.g. of a schedule removed and
  -- defined again: it stays that, never the pending one a pause or redefinition deletes.
  -- A spec record is an enqueued job's (enqueue refuses 'schedule:' ids since; one accepted
  -- before) and is never adopted either: a pause would delete it. Two one-key EXISTS, as in
  -- enqueue.lua.
  local guard = 0
  while redis.call('EXISTS', jk) == 1 or redis.call('EXISTS', spec_key(prefix, id)) == 1 do
    local v = redis.pcall('HMGET', jk, 'state', 'fence')
    if not v.err and v[1] == 'due' and not v[2]
        and redis.call('EXISTS', spec_key(prefix, id)) == 0 then
      break  -- its own occurrence, never claimed: adopt it
    end
    local later = slot_after(prefix, h, slot)
    guard = guard + 1
    if later == nil or guard > 100 then return nil end
    slot = later
    id = occurrence_id(h.name, slot)
    jk = job_key(prefix, id)
  end
  if redis.call('EXISTS', jk) == 0 then
    if sched_job(prefix, h, id, slot + h.offset_ms, slot, now) then wake(prefix .. 'wake') end
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

-- Where placing starts when no occurrence just ended (create, redefine, resume): the first slot
-- not yet due, but never back at or before the last slot that left due (ran_ms). Its job record
-- guards that slot only until it expires, and a redefinition with a larger offset (jitter)
-- would otherwise place it again.
local function sched_from(h, now)
  return math.max(now - h.offset_ms, h.ran_ms)
end

-- Make the occurrence that follows slot `after` pending, under the misfire policy: at most
-- `budget` of the slots already overdue (slot + offset <= now) may still run, the latest ones.
-- Returns the id, or nil when the cron buffer does not reach past now (the schedule is then
-- marked starved and queued for a refill, which calls this again with the same budget).
-- A pending occurrence still named in `h` is the one that just left due: its caller recorded
-- its slot as ran_ms if it was due (at claim, or when it ended without running).
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

-- When the pending occurrence is due: its score in due, or in flow:held (set aside by flow
-- control at a claim, under its run_at). Not slot + the stored offset: a redefinition that kept
-- a due run may have changed the jitter since, and the run keeps its own time. nil when
-- neither holds it (or flow:held is of another type: pcall). The caller checked due is a ZSET.
local function sched_pending_at(prefix, h)
  if h.pending == '' then return nil end
  local at = redis.call('ZSCORE', prefix .. 'due', h.pending)
  if not at then at = redis.pcall('ZSCORE', prefix .. 'flow:held', h.pending) end
  return type(at) == 'string' and tonumber(at) or nil
end

-- Is the pending occurrence still waiting: in due, or set aside by flow control (its key's
-- limit or its rate window is full: flow:held)? The caller checked that due is a ZSET.
local function sched_waiting(prefix, h)
  if h.pending == '' then return false end
  if redis.call('ZSCORE', prefix .. 'due', h.pending) then return true end
  -- pcall: flow:held is the list of every job set aside (counts, cancel, doctor read it); one
  -- edited into another type must not fail an upsert of the same definition (every start-up).
  local held = redis.pcall('ZSCORE', prefix .. 'flow:held', h.pending)
  if type(held) ~= 'table' then return held ~= false end
  -- Then the occurrence's own hold set, the one claim takes it back from, says it: its key's
  -- (flow:ckheld:<key>, the key in its hash) or the rate one (flow:rheld). An error is no.
  local v = redis.pcall('HMGET', job_key(prefix, h.pending), unpack(FLOW_READ))
  if v.err then return false end
  local f = flow_from(v, 1)
  if type(redis.pcall('ZSCORE', prefix .. 'flow:rheld', h.pending)) == 'string' then
    return true
  end
  return f.ckey ~= ''
    and type(redis.pcall('ZSCORE', prefix .. 'flow:ckheld:' .. f.ckey, h.pending)) == 'string'
end

-- Take occurrence `id` out of due, its priority index and every flow set (`f`: its flow;
-- flow_forget takes it out of the index).
local function sched_withdraw(prefix, id, f, now)
  redis.call('ZREM', prefix .. 'due', id)
  flow_forget(prefix, id, now, f)
end

-- Remove the pending occurrence if it is still waiting in due, or set aside by flow control
-- (pause, remove, redefine): out of due, its priority index and every flow set. Called before
-- the caller's first write: returns nil, or a CORRUPT error reply (nothing written, the caller
-- returns it) when a key the withdrawal needs is of another type (edited by hand): `due` (the
-- truth of "due": the occurrence cannot leave it), for an occurrence with a concurrency key
-- `leased` (lib/flow.lua flow_release reads the key's lapsed leases in it, with redis.call),
-- and for one with waiting children the dead key and `leased` (they are parked, dead_letter
-- takes each out of both: it will never be done).
local function sched_unpend(prefix, h, now)
  if h.pending == '' then return nil end
  -- The state, fence and flow fields (FLOW_READ) in one read; flow_forget takes the parsed flow.
  -- pcall: an occurrence key of another type (hand-edited) is left for doctor, but its id
  -- still leaves due and the flow sets (with the flow the schedule gives its occurrences), so
  -- pause, remove and redefine go on. `kids`: jobs enqueued after=[it] wait for it.
  -- One claimed before (a fence: claimed while the hash was unreadable, nothing re-armed, now
  -- a retry or a requeued run) is a run of its own, never adopted by a placing: it is kept.
  local v = redis.pcall('HMGET', job_key(prefix, h.pending), 'kids', 'state', 'fence',
    unpack(FLOW_READ))
  local kids = not v.err and v[1]
  local f
  if v.err then f = flow_load(sched_key(prefix, h.name))
  elseif v[2] == 'due' and not v[3] then f = flow_from(v, 4) end
  if f then
    local bad = zset_err(prefix, 'due')
      or ((f.ckey ~= '' or kids) and zset_err(prefix, 'leased')) or (kids and dead_err(prefix))
    if bad then return bad end
    sched_withdraw(prefix, h.pending, f, now)
    -- Deleted, it can never end done: its waiting children are parked as by a cancel.
    if kids then flow_parent_ended(prefix, h.pending, 'cancelled', now) end
    if not v.err then job_del(prefix, h.pending) end
  end
  redis.call('HSET', sched_key(prefix, h.name), 'pending', '')
  h.pending = ''
  return nil
end

-- Called by claim for a due job that names a schedule, in the same script, before leasing it.
-- When it is the schedule's pending occurrence, the next one is inserted right here, so a
-- worker dying at any later point can neither skip nor double a run. A retry, or an occurrence
-- of a removed or redefined schedule, is simply run. Returns false when the misfire policy
-- drops this late occurrence (it is then marked cancelled with skipped='misfire', not leased);
-- nil when the decision waits for a refill (below): it stays pending in due, untouched.
local function sched_rearm(prefix, name, id, now)
  local h = sched_load(prefix, name)
  if h == nil or h.pending ~= id then return true end
  local cur = h.cursor_ms
  local n = h.misfire_n
  -- Overdue slots after this one: the runs missed while nothing claimed.
  local m = slots_between(prefix, h, cur, now - h.offset_ms)
  -- A cron buffer that ends before now (an outage longer than it) counts only the missed
  -- slots it holds: when that count would run this stale one (catch_up:N above it), wait for
  -- the refill this claim's reply asks for, then decide. The first claim of the slot waits;
  -- later ones while that refill is still asked for (a claim's refill tops up 20 schedules,
  -- more when it claimed more: operations/leasing.py refill_most; another worker may claim
  -- before the asking one refills), at most SCHED_DEFER_MOST times per slot (deferred_ms,
  -- deferrals), so a refill that keeps failing cannot make workers claim it in a loop: each
  -- deferring claim refills one round of at least 20.
  if h.kind == 'cron' and m > 0 and m < n and slot_after(prefix, h, now - h.offset_ms) == nil then
    local sk = sched_key(prefix, name)
    local d = redis.call('HMGET', sk, 'deferred_ms', 'deferrals')
    local k = 0
    -- Strictly: read by tonumber, a hand edit ('-inf', '-1e300') never reached the bound.
    if d[1] == fmt(cur) then k = parse_int(d[2], 1, SCHED_DEFER_MOST) or 1 end
    local refill = sched_refill_key(prefix)
    if k == 0 or (k < SCHED_DEFER_MOST and redis.pcall('SISMEMBER', refill, name) == 1) then
      redis.call('HSET', sk, 'deferred_ms', fmt(cur), 'deferrals', fmt(k + 1))
      if k == 0 then redis.pcall('SADD', refill, name) end
      return nil
    end
  end
  -- Claimed, so it was due, whatever the offset now stored says (a redefinition that kept
  -- it changed the jitter): its slot left due, and no later placing may run it again.
  if cur > h.ran_ms then
    redis.call('HSET', sched_key(prefix, name), 'ran_ms', fmt(cur))
    h.ran_ms = cur
  end
  local run = (m == 0) or (m < n)
  local budget = n
  if run then budget = math.max(n - 1, 0) end
  if not run then
    local jk = job_key(prefix, id)
    redis.call('ZREM', prefix .. 'due', id)
    redis.call('HSET', jk, 'state', 'cancelled', 'skipped', 'misfire', 'finished_ms', fmt(now))
    redis.call('PEXPIRE', jk, SCHED_DROP_TTL_MS)
    -- Cancelled: jobs waiting for it are parked (claim checked the dead key before its writes).
    if redis.call('HGET', jk, 'kids') then flow_parent_ended(prefix, id, 'cancelled', now) end
    bump_stat(prefix, now, 'misfire_skip', 1)
  end
  -- Counted once placed: a starved cron schedule's next one is counted by its refill.
  if sched_place(prefix, h, cur, budget, now) then bump_stat(prefix, now, 'rearm', 1) end
  return run
end

-- The pending occurrence `id` of schedule `name` ended without running (parked by claim or by
-- hand, purged, cancelled): arm the next one, so the schedule goes on. Under its own misfire
-- policy: that run alone is skipped, the missed ones the policy runs still run (a budget of 0
-- would skip them all). Anything else (a retry, a run that already re-armed at claim, a paused
-- or removed schedule) changes nothing.
local function sched_ended(prefix, name, id, now)
  local h = sched_load(prefix, name)
  if h == nil or h.pending ~= id or h.paused == '1' then return end
  -- Its slot left due if the run was due by now: by its own time (run_at_ms; a redefinition
  -- that kept it may have changed the stored offset since), slot + offset when unreadable.
  -- One cancelled before its time must not hold a redefinition's first run back until then.
  local v = redis.pcall('HGET', job_key(prefix, id), 'run_at_ms')
  local at = parse_int(v, 0, LIM.time_ms) or h.cursor_ms + h.offset_ms
  if h.cursor_ms > h.ran_ms and at <= now then
    redis.call('HSET', sched_key(prefix, name), 'ran_ms', fmt(h.cursor_ms))
    h.ran_ms = h.cursor_ms
  end
  if sched_place(prefix, h, h.cursor_ms, h.misfire_n, now) then
    bump_stat(prefix, now, 'rearm', 1)
  end
end
