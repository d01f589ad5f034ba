--[[ repair: doctor --fix's job moves, made by the same lib/job.lua moves as the transitions,
  so a repair and a claim park a job identically. Each move first checks, in the same atomic
  step, that the id is still where doctor's plan found it (ARGV[3], and its lease ARGV[4]): a job
  claimed, reaped, finished or requeued since the check is not moved (reply 0). A job set aside
  by flow control (in flow:held: a key limit, a rate window, parents not done) is in due, as
  doctor reads it; no move takes it out of its hold but 'unlist' of due. Sent by
  scheduler/admin/doctor.py inside its WATCH/MULTI (it re-read the job first), with doctor's
  server-time reading as now.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, stats:<minute>, schedule:<name>, schedules:refill, dead:migrating, config, result:<id>, result_wait:<id>, flow:levels, flow:pdue:<p>, flow:ck:<key>, flow:ckheld:<key>, flow:rheld, flow:held, flow:waiting, flow:children:<id>, flow:ending, flow:ending:<word>:<id>, finished
  ARGV[1] move   ARGV[2] id: any id stored in a place, up to STORED_ID_MAX bytes (a hand-written
          id no API would make, e.g. with a space, is still an id doctor must be able to move)
  ARGV[3] expect: the places the id is in now, in the order due,leased,dead, comma-joined
          ('' = none of them)
  ARGV[4] lease_until_ms: the id's score in leased must be this ('' = not checked)
  ARGV[5] now_ms
  ARGV[6..] by move:
    'dead'    park the job (lib dead_letter): ARGV[6] reason (1..200 bytes), ARGV[7] dead_ms
              (when it died); as fail's park, its key slot is freed, its waiting children
              parked (lib/flow.lua), its result waiters woken (lib/result.lua), and it leaves
              its priority index. Not a held job
              (reply 0): claim parks it when it runs. ARGV[8] 'gone': only while neither its
              hash nor its spec record exists (lib job_exists), as claim parks such an id ('job
              hash missing'): an id enqueued again since the check is not parked (reply 0).
    'due'     into due (lib flow_to_due, off leased: its key slot freed, back into its priority
              index) at ARGV[6] run_at_ms; state 'due', no worker, no expiry, wake idle workers
              (as claim's reaper and release do). From no place (expect ''): only while the job
              exists and its state is '' (its spec alone), 'due' or 'leased' (reply 0: finished
              or gone since the check)
    'unlist'  off the places in ARGV[6] (comma-joined; dead through lib dead_unlist; due, for
              a held job, out of its hold sets: flow:held, flow:rheld, flow:waiting and its
              key's flow:ckheld, the reason fields dropped; not its key's leases; else out of
              its priority index; leased through lib flow_release: its key slot freed, as
              every way out of leased frees it; kept in due and due now, the slot alone: claim
              meets it in the key's order), then state := ARGV[7]; ARGV[7] '' = the job is
              gone: only while neither its hash nor its spec record exists (lib job_exists: a
              pending job is its spec alone)
    'state'   state := ARGV[6], the one expected place; worker dropped unless 'leased'
    'lease'   into leased at ARGV[6] lease_until_ms, from no place (expect ''), only while its
              state is 'leased' and its token ARGV[7] (the claim doctor read): a lease entry
              lost by hand while its worker may still run it; that worker's heartbeats keep
              it, and if the worker is gone the lease lapses as any other (claim's reaper).
              Its concurrency key's slot is taken again too (flow:ck:<key>)
    'score'   its score in the one expected place (due or leased; flow:held for a held job)
              := now_ms (due: its priority index entry too), only while it is still no time
              in 0 .. 2^53 (a reschedule or a heartbeat since: reply 0)
    'persist' drop the expiry of a job in a place (its hash and its spec record)
    'expire'  a record in no place expires in ARGV[6] ttl_ms (its hash and its spec record),
              listed in the finished index until then (a complete refused at its PEXPIRE
              never listed it)
    'ckfree'  off its key's lease set flow:ck:<ARGV[6]> (a key name), while it is a member and no
              lease of that key (in leased, its `ckey` field the key): a member added by hand
              holds a slot no lease end frees; the key's held jobs then take the room (as a
              lease's end lets them: lib/flow.lua's walk of the key's oldest held jobs by
              their own limits, FIFO). Counted as nothing; the finished index is not touched
    'ckstale' off its key's hold set flow:ckheld:<ARGV[6]>, while it is a member and not held
              (no flow:held entry): a stale head is read as a held job of limit 1 and stops
              the walk that lets the key's held jobs go; then that walk runs. Counted as
              nothing; the finished index is not touched
  A job that is its spec record alone gets no hash from 'due' or 'state' due (claim creates
    it whole; a hash holding only `state` would park the job as unreadable).
  Every move but 'expire' takes the id out of the finished index (lib/result.lua): a done or
    cancelled record moved back into a place (or found gone) is no longer listed as finished.
  Counted as the transition each move stands in for counts it (stats:<minute>, lib/util.lua
    bump_stat): a move checked against a lease (ARGV[4], doctor's lease-expired) is claim's
    reaper, `expired`, and 'due' adds one to the job's `lapses` as the reaper does (two make a
    suspect); 'dead' of a job found in due or leased is a new `dead`, as claim's and fail's
    parks; a dead job put back on the dead list, and every other move, count nothing.
  Returns: 1 moved, 0 not moved (the id is no longer where the plan found it, or an older
    dead LIST is still being converted). Parking a schedule's pending occurrence arms its next
    one (as claim does): the reply is then that next run's id (moved too).
  Errors:  BAD_ARGUMENT <field>=<value> ]]
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/rearm.lua"
-- @include "lib/flow.lua"
-- @include "lib/result.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, due, leased, dead, wake_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local move, id, expect, lease_arg = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local MOVES = { dead = true, due = true, unlist = true, state = true, score = true,
  persist = true, expire = true, ckfree = true, ckstale = true, lease = true }
local PLACE_KEY = { due = due, leased = leased, dead = dead }
local STORED_ID_MAX = 1024
if not MOVES[move] then return redis.error_reply('BAD_ARGUMENT move=' .. tostring(move)) end
if type(id) ~= 'string' or id == '' or #id > STORED_ID_MAX then
  return redis.error_reply('BAD_ARGUMENT id=')
end
if type(expect) ~= 'string' or not string.find(expect, '^[a-z,]*$') then
  return redis.error_reply('BAD_ARGUMENT expect=')
end
local now, err = int_arg(ARGV[5], 'now_ms', 0, LIM.time_ms)
if err then return err end
local lease_until = nil
if lease_arg ~= '' then
  lease_until, err = int_arg(lease_arg, 'lease_until_ms', 0, LIM.time_ms)
  if err then return err end
end

-- The move's own arguments, all checked before the first write.
local reason, at, run_at, ttl, drop, state, ckey, token
if move == 'dead' then
  reason = ARGV[6]
  if type(reason) ~= 'string' or reason == '' or #reason > 200 then
    return redis.error_reply('BAD_ARGUMENT reason=')
  end
  at, err = int_arg(ARGV[7], 'dead_ms', 0, LIM.time_ms)
  if not err and ARGV[8] ~= nil and ARGV[8] ~= 'gone' then
    return redis.error_reply('BAD_ARGUMENT gone=')
  end
elseif move == 'due' then
  run_at, err = int_arg(ARGV[6], 'run_at_ms', 0, LIM.time_ms)
elseif move == 'expire' then
  ttl, err = int_arg(ARGV[6], 'ttl_ms', 1, LIM.ttl_ms)
elseif move == 'unlist' then
  drop, state = {}, ARGV[7]
  for p in string.gmatch(ARGV[6] or '', '[^,]+') do
    if not PLACE_KEY[p] then return redis.error_reply('BAD_ARGUMENT places=' .. p) end
    drop[#drop + 1] = p
  end
  if #drop == 0 then return redis.error_reply('BAD_ARGUMENT places=') end
  if state ~= '' and not PLACE_KEY[state] then return redis.error_reply('BAD_ARGUMENT state=') end
elseif move == 'state' then
  state = ARGV[6]
  if state ~= expect or not PLACE_KEY[state] then return redis.error_reply('BAD_ARGUMENT state=') end
elseif move == 'score' then
  if expect ~= 'due' and expect ~= 'leased' then return redis.error_reply('BAD_ARGUMENT expect=') end
elseif move == 'lease' then
  if expect ~= '' then return redis.error_reply('BAD_ARGUMENT expect=') end
  run_at, err = int_arg(ARGV[6], 'lease_until_ms', 0, LIM.time_ms)
  token = ARGV[7]
  if not err and (type(token) ~= 'string' or token == '' or #token > 200) then
    return redis.error_reply('BAD_ARGUMENT token=')
  end
elseif move == 'ckfree' or move == 'ckstale' then
  ckey = ARGV[6]
  if not task_ok(ckey) then return redis.error_reply('BAD_ARGUMENT key=') end
end
if err then return err end

-- Where the id is now; dead_migrate first, so the dead key is the ZSET (doctor converts an
-- older LIST before it checks: a conversion still under way means its plan is not current).
if dead_migrate(prefix, now) > 0 then return 0 end
local here, held = {}, false
for _, p in ipairs({ 'due', 'leased', 'dead' }) do
  local at = redis.call('ZSCORE', PLACE_KEY[p], id)
  if not at and p == 'due' then
    -- Set aside by flow control: due, as doctor reads it (flow:held of another type: not held).
    held = type(redis.pcall('ZSCORE', prefix .. 'flow:held', id)) == 'string'
    at = held
  end
  if at then here[#here + 1] = p end
end
if table.concat(here, ',') ~= expect then return 0 end
if lease_until ~= nil and tonumber(redis.call('ZSCORE', leased, id)) ~= lease_until then
  return 0
end

local jk = job_key(prefix, id)
local armed = nil  -- 'dead': the next run of the schedule whose pending run it parked

-- A held job leaves its hold sets (not its key's leases: a job also leased keeps its slot).
local function unhold()
  local ckey = flow_load(jk).ckey
  -- pcall: a hold set edited into another type must not fail the repair after its first write.
  for _, set in ipairs({ 'flow:held', 'flow:rheld', 'flow:waiting' }) do
    redis.pcall('ZREM', prefix .. set, id)
  end
  if ckey ~= '' then redis.pcall('ZREM', prefix .. 'flow:ckheld:' .. ckey, id) end
  redis.call('HDEL', jk, 'flow_reason', 'waiting_for', 'parents')
end

if move == 'dead' then
  -- Never out of a hold (a waiting child stays waiting): claim parks it once it is released.
  if held or (ARGV[8] == 'gone' and job_exists(prefix, id)) then return 0 end
  -- As claim's park: a schedule's pending occurrence parked here arms the schedule's next one.
  local name = redis.pcall('HGET', jk, 'schedule')
  if not schedule_name_ok(name) then name = string.match(id, '^schedule:([%w_.%-]+):%d+$') end
  if name then
    sched_ended(prefix, name, id, at)
    -- The run it armed is the reply (doctor reports it): '' or the parked id, none armed.
    armed = redis.pcall('HGET', sched_key(prefix, name), 'pending')
    if type(armed) ~= 'string' or armed == '' or armed == id then armed = nil end
  end
  -- The flow read before the park: the dead retention may delete the job at once (max_count
  -- 0, a same-ms tie), and a read after it finds no key slot to free (as fail does).
  local fl = flow_load(jk)
  dead_letter(prefix, id, reason, at, at)
  flow_unindex(prefix, id, fl.priority)  -- out of due: out of its level's index too
  flow_release(prefix, id, now, fl)
  flow_parent_ended(prefix, id, 'dead', now)
  result_wake(prefix, id, 'dead', RESULT_WAKE_DEAD_TTL_MS)
  if expect ~= '' then bump_stat(prefix, now, 'dead', 1) end  -- not a lost dead one re-listed
  if lease_until then bump_stat(prefix, now, 'expired', 1) end
elseif move == 'due' then
  -- A job in no place goes to due only while it is one that waits or runs: finished since
  -- the check (its record in no place is where a done job is), or gone, it stays so.
  if expect == '' then
    local st = redis.pcall('HGET', jk, 'state')
    if type(st) == 'table' or not job_exists(prefix, id)
        or (st and st ~= 'due' and st ~= 'leased') then
      return 0
    end
  end
  -- Read before the first write: the lapse count a reap adds to (claim.lua's reaper).
  local lapses = lease_until and parse_int(redis.pcall('HGET', jk, 'lapses'), 0, LIM.fence - 1)
  flow_to_due(prefix, id, run_at, now)
  if redis.call('EXISTS', jk) == 1 then
    redis.call('HSET', jk, 'state', 'due')
    redis.call('HDEL', jk, 'worker')
    redis.call('PERSIST', jk)
    if lease_until then redis.call('HSET', jk, 'lapses', fmt((lapses or 0) + 1)) end
  end
  if lease_until then bump_stat(prefix, now, 'expired', 1) end
  redis.call('PERSIST', spec_key(prefix, id))
  wake(wake_key)
elseif move == 'unlist' then
  if (state == '') == job_exists(prefix, id) then return 0 end
  local fl = flow_load(jk)  -- read before the first write, as fail reads it
  -- Off leased, its key slot is freed, as every way out of leased frees it (else it stays
  -- taken, the key's held jobs behind it, until doctor reports it stray). Kept in due and due
  -- now, it lets none of them go: claim meets it and keeps the key's order (an older held job
  -- goes first, else it takes the slot); a release would let newer held jobs run before it.
  local function unlease()
    local at = not held and state == 'due' and tonumber(redis.call('ZSCORE', due, id))
    if not (at and at <= now) then return flow_release(prefix, id, now, fl) end
    local key = fl.ckey ~= '' and fl.ckey or fl.ckey_lost
    if key then redis.pcall('ZREM', prefix .. 'flow:ck:' .. key, id) end
  end
  for _, p in ipairs(drop) do
    if p == 'dead' then
      dead_unlist(prefix, id, now)
    elseif p == 'due' and held then
      unhold()
    else
      redis.call('ZREM', PLACE_KEY[p], id)
      if p == 'due' then flow_unindex(prefix, id, fl.priority) end
      if p == 'leased' then unlease() end
    end
  end
  -- A pending job with no hash yet (its spec record alone) stays so: a hash of `state` alone
  -- is a job no claim can read (the next check parked it as an invalid job).
  if state ~= '' and not (state == 'due' and redis.call('EXISTS', jk) == 0) then
    redis.call('HSET', jk, 'state', state)
  end
elseif move == 'state' then
  if state == 'due' and redis.call('EXISTS', jk) == 0 then return 0 end
  redis.call('HSET', jk, 'state', state)
  if state ~= 'leased' then redis.call('HDEL', jk, 'worker') end
elseif move == 'lease' then
  -- Still the run doctor saw (a claim, a release or an end since changed the state or token).
  if redis.pcall('HGET', jk, 'state') ~= 'leased' or redis.pcall('HGET', jk, 'token') ~= token then
    return 0
  end
  redis.call('ZADD', leased, run_at, id)
  -- And its concurrency key's slot (a check may have freed it as no lease's: ckfree), as claim
  -- takes it: a job of the key let out meanwhile is held again by the claim that meets it.
  local fl = flow_load(jk)
  local ckey = fl.ckey ~= '' and fl.ckey or fl.ckey_lost  -- its limit edited: still its key's
  if ckey then redis.pcall('ZADD', prefix .. 'flow:ck:' .. ckey, run_at, id) end
elseif move == 'score' then
  -- Only a score still no time (doctor's bad-score): one a reschedule, a debounced enqueue
  -- or a heartbeat set since is a time, and now would run the job early or end a live lease.
  local place = held and (prefix .. 'flow:held') or PLACE_KEY[expect]
  local cur = tonumber(redis.call('ZSCORE', place, id))
  if cur and cur >= 0 and cur <= 9007199254740992 then return 0 end
  local priority = flow_load(jk).priority  -- read before the first write
  redis.call('ZADD', place, 'XX', now, id)
  -- Its level's index at the same time (else the priority pass waits for the old score).
  if expect == 'due' and not held then flow_index(prefix, id, priority, now) end
elseif move == 'ckfree' then
  local ck = prefix .. 'flow:ck:' .. ckey
  if type(redis.pcall('ZSCORE', ck, id)) ~= 'string' then return 0 end
  if redis.call('ZSCORE', leased, id) and redis.pcall('HGET', jk, 'ckey') == ckey then return 0 end
  redis.call('ZREM', ck, id)
  -- As a lease's end: the oldest held jobs go, each while its own limit has room, the first
  -- without room stopping the rest. Before, the head's limit alone counted: jobs behind it
  -- went to due past their own limits, out of the key's FIFO order (claim held them again).
  local live = flow_ck_live(prefix, ckey, now)
  if live then flow_ck_next(prefix, ckey, now, live, 0) end
  return 1
elseif move == 'ckstale' then
  -- Only an entry whose job is not held (its own hold set flow:held is the truth).
  if held or type(redis.pcall('ZSCORE', prefix .. 'flow:held', id)) == 'string' then return 0 end
  if redis.pcall('ZREM', prefix .. 'flow:ckheld:' .. ckey, id) ~= 1 then return 0 end
  local live = flow_ck_live(prefix, ckey, now)
  if live then flow_ck_next(prefix, ckey, now, live, 0) end
  return 1
elseif move == 'persist' then
  if expect == '' then return 0 end
  redis.call('PERSIST', jk)
  redis.call('PERSIST', spec_key(prefix, id))
else -- expire: a record in no place (done or cancelled) is listed as finished until then
  if expect ~= '' or not job_exists(prefix, id) then return 0 end
  job_expire(prefix, id, ttl)
  finished_add(prefix, now, { now + ttl, id })
  return 1
end
-- pcall: an index edited into another type is left as it is (doctor reports it).
redis.pcall('ZREM', prefix .. 'finished', id)
return armed or 1
