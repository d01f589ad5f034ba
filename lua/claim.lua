--[[ claim: lease up to `limit` due jobs to one worker. Lapsed leases are reaped on the same
  path first, so a job whose worker died is due again without any janitor process.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, stats:<minute>, schedule:<name>, schedules:refill, claim:<nonce>, dead:migrating, config, partitions, result:<id>, result_wait:<id>, flow:levels, flow:pdue:<p>, flow:ck:<key>, flow:ckheld:<key>, flow:rate:<key>, flow:rheld, flow:held, flow:waiting, flow:children:<id>, flow:ending, flow:ending:<word>:<id>, isolated, finished
  ARGV[1] worker id
  ARGV[2] limit          jobs to lease at most (>= 0); a call also stops taking jobs once their
                         payloads reach 4 MiB (the job that passes it is taken: the first
                         always is), the rest left due: next_ms is then now or earlier
  ARGV[3] lease_ms       lease length (> 0)
  ARGV[4] nonce          random, unique per call: part of every token, and the replay key
  ARGV[5] reap_limit     lapsed leases handled per call at most (0 .. LIM.reap_limit; REAP_STEP
                         at most, whatever the value: the rest by the next claims)
  ARGV[6] holding        optional: how many leases the worker holds now, on any queue ('' or
                         absent: not said). A last-attempt suspect is leased only to a worker
                         that says 0 (below)
  ARGV[7] drained_for    optional, with holding: the suspect this worker drains for (the reply's
                         drain field), looked at first
  Returns: {now_ms, next_ms, n, then 11 fields per job: id, token, attempts, max_attempts, task,
    payload, run_at_ms, backoff ('base_ms,factor,cap_ms,jitter' or ''), timeout_ms, schedule,
    start_by_ms ('' for none)}. next_ms is the earliest time something may become claimable
    (head of due or of leased), or -1 when both are empty. While the queue is paused
    (queue_pause.lua: config's paused_ms) it leases nothing and next_ms is the leased head's. After the jobs, one more number:
    how many schedules wait for a cron-buffer refill (advisory: read now, also in a replay);
    then, when this call leased a suspect (below), its id ('' when only a drain follows); then,
    when this worker is to drain for a last-attempt suspect (below), that suspect's id.
    Claiming a schedule's pending occurrence inserts the next one in this same call, or drops
    a late one by the misfire policy (lib/rearm.lua); one whose cron buffer ends before now
    (a long outage) stays due while the refill this reply asks for is outstanding.
    The token is '<fence>-<nonce>': the fence is a per-job counter bumped at every claim, and
    the nonce makes a token unique even if a failover loses the last increment.
    A re-sent call with the same nonce returns the first call's jobs (those it still holds) and
    changes nothing.
  Side effects: attempts is counted here, at claim; a job whose attempts are used up is parked
    with reason 'lease expired' (lapsed) or 'attempts exhausted', one past its start deadline
    (lib/job.lua spec_flags; a schedule's run: its hash's start_by_ms, checked after the
    misfire policy, lib/rearm.lua sched_job) with 'start deadline passed'; a job hash that
    cannot be read (edited by hand) is parked alone with reason 'invalid job: <field>': every
    field the reply carries is checked first (read_claimable), so the reply only holds values
    a client parses.
    A job never claimed is its spec record alone (lib/job.lua): its first claim creates the
    hash with the lease, task, run_at_ms, enqueued_ms and a max_attempts other than 5; the
    payload, backoff, timeout_ms and the default max_attempts stay in the spec. A record
    that cannot be read parks that job alone ('invalid job: record').
    Parking a schedule's pending occurrence arms the schedule's next one.
    The opt-in dead-letter retention (config: dead_max_age_ms / dead_max_count, lib/job.lua
    dead_trim) is applied at every call, paused or not, at most 100 of the oldest per call.
    The reaper counts each lapse it puts back in due (`lapses`, parsed strictly: a hand-edited
    value reads as 0). A job with 2 or more is a suspect (it was in two crashed batches), and one
    with 1 whose lease taken is its last attempt (else max_attempts 2 parked a batch-mate): a
    worker holds at most one suspect lease at a time (`isolated`: worker id -> job id, checked
    lazily), so a job that kills its worker ends up alone; a suspect it may not take stays due
    for another worker (a call that took one and left others pushes a wake-up), re-scored in
    due to this call's time, never earlier than its score, and out of its priority index:
    behind the jobs due before it, so more suspects than a scan's budget cannot starve them.
    next_ms does not count it: the worker claims again when its suspect ends
    (docs/durability.md), or at once while its scans move suspects due before it took its own
    and older jobs are left; a call that took nothing answers at most SUSPECT_POLL_MS ahead.
    A suspect whose lease taken is its last attempt runs truly alone: a crash of its worker
    parks it, so no other job may share that process. It is leased only as the first job of a
    call from a worker that says it holds nothing (ARGV[6] '0'), and that call takes nothing
    more; a worker holding one (`isolated`'s value '!<id>') is leased nothing until it ends.
    Met by a worker holding jobs, it is skipped as above, and one worker at a time (the job's
    `drainer`: '<until_ms> <worker>', for lease_ms; a mark further ahead than a day is not
    honoured) is told to drain (the reply's last field; that call takes nothing more): take
    nothing new until it holds nothing, claiming with drained_for (each such claim renews its
    mark and takes nothing while it holds jobs), so it cannot wait for an idle moment that a
    busy fleet never has. A replay answers the drain its first call told.
  Errors:  BAD_ARGUMENT <field>=<value> (queue=<name> is partitioned: a partitioned queue's own
    name, whose partitions hold its jobs, lib/util.lua partitioned_err); CORRUPT due | leased |
    dead | dead:migrating is not a zset (a key edited by hand into another type); nothing
    written either way ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/lease.lua"
-- @include "lib/utf8.lua"
-- @include "lib/rearm.lua"
-- @include "lib/flow.lua"
-- @include "lib/lateness.lua"
-- @include "lib/result.lua"

-- Steps in `do` blocks where they can be: their locals end with the block. The main function
-- also holds every lib's top-level local the script uses, and Lua allows it 200 locals at once
-- (tests/test_lua_locals.py counts them).
local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, due, leased = KEYS[1], KEYS[2], KEYS[3]
local worker, nonce = ARGV[1], ARGV[4]
local limit, lease_ms, reap_limit, holding
-- Reaping costs 30-50 us a lease: 10,000 (the largest reap_limit) held the server 290-520 ms,
-- every client waiting. A larger value is still taken (older clients send it) but reaps this
-- many per call; the rest stay in leased for the next claims (scheduler/core/limits.py
-- REAP_PER_CALL repeats it).
local REAP_STEP = 500
do
  local err
  limit, err = int_arg(ARGV[2], 'limit', 0, LIM.limit); if err then return err end
  lease_ms, err = int_arg(ARGV[3], 'lease_ms', 1, LIM.lease_ms); if err then return err end
  reap_limit, err = int_arg(ARGV[5], 'reap_limit', 0, LIM.reap_limit); if err then return err end
  if reap_limit > REAP_STEP then reap_limit = REAP_STEP end
  if ARGV[6] and ARGV[6] ~= '' then
    holding, err = int_arg(ARGV[6], 'holding', 0, LIM.limit); if err then return err end
  end
  if #nonce < 1 or #nonce > 64 or not string.find(nonce, '^%w+$') then
    return redis.error_reply('BAD_ARGUMENT nonce=')
  end
  if worker == '' or #worker > 200 then return redis.error_reply('BAD_ARGUMENT worker=') end
  -- A partitioned queue's own name holds no job (its partitions do): an empty batch with
  -- next_ms -1 there read as 'the queue is empty' beside due jobs, so it is refused as enqueue
  -- is (one EXISTS, before the replay read and any write).
  err = partitioned_err(prefix); if err then return err end
end

-- Defined in a block: the tables of texts met are its upvalues, not the main function's locals.
local read_claimable
do
  -- Every field the reply hands out, read and checked the strict way (lib/util.lua): returns the
  -- reply's values {attempts, max_attempts, task, payload, run_at_ms, backoff, timeout_ms,
  -- schedule, state, token, settled_token, settled, settled_log}, or nil and a dead reason.
  local READ = { 'task', 'payload', 'attempts', 'max_attempts', 'run_at_ms', 'backoff',
    'timeout_ms', 'schedule', 'state', 'fence', 'token', 'settled_token', 'settled', 'settled_log',
    'priority', 'ckey', 'rkey', 'lapses', 'start_by_ms' }
  -- Most jobs of a call share one task name, backoff text and timeout: each distinct one is
  -- checked once per call (as enqueue.lua does).
  -- The defaults (most jobs') are known good: a spec record stores them as ''.
  local task_seen, backoff_seen, timeout_seen = {}, { [SPEC_BACKOFF] = true }, { ['0'] = true }
  -- So do their number texts (attempts '0', max_attempts '5', one run time for jobs enqueued
  -- together): each distinct text of a field is parsed once per call (issue 16, drain).
  local ints_seen = { attempts = {}, max_attempts = {}, run_at_ms = {}, enqueued_ms = {} }
  local function int_once(field, v, lo, hi)
    local seen = ints_seen[field]
    local x = seen[v]
    if x == nil and v then
      x = parse_int(v, lo, hi) or false
      seen[v] = x
    end
    return x or nil
  end
  function read_claimable(id, jk, run_at_s)
    -- A plain job never claimed has no hash yet (most claims of a drain): one EXISTS instead of
    -- a 17-field HMGET of nothing; a job with a hash (a retry, a flow job, a schedule's
    -- occurrence) pays the EXISTS on top (~1%). f then reads as that HMGET's reply would.
    local f = { false, false, false, false, false, false, false, false, false, false, false,
      false, false, false, false, false, false, false, false }  -- #READ falses (no rehashing)
    if redis.call('EXISTS', jk) == 1 then
      f = redis.pcall('HMGET', jk, unpack(READ))
      if f.err then return nil, 'invalid job: not a hash' end
    end
    if not job_id_ok(id) then return nil, 'invalid job: id' end
    local sp = false
    if not f[2] or not f[9] then
      -- This version's layout: the payload (and, before the first claim, all) is in the spec.
      local bad
      sp, bad = job_spec(prefix, id, run_at_s)
      if sp == nil then return nil, 'invalid job: ' .. bad end
      if sp == false and f[9] == false then return nil, 'job hash missing' end
    end
    local fresh = f[9] == false
    if fresh then
      -- Never claimed: the spec fills what the hash lacks (a field set by hand wins, and is
      -- checked like any other).
      if not run_at_s then return nil, 'job hash missing' end
      f[1], f[3], f[4] = f[1] or sp.task, f[3] or '0', f[4] or sp.max_attempts
      f[5], f[6], f[7], f[9] = f[5] or run_at_s, f[6] or sp.backoff, f[7] or sp.timeout_ms, 'due'
    end
    if sp then
      -- backoff, timeout_ms and a default max_attempts stay in the spec (first claim does not
      -- copy them): a hash field (an older version's claim, a hand edit) wins.
      f[2], f[6], f[7] = f[2] or sp.payload, f[6] or sp.backoff, f[7] or sp.timeout_ms
      -- task too: a job parked before its first claim (a dead parent) and requeued has a hash
      -- without the spec's short fields.
      f[1], f[4] = f[1] or sp.task, f[4] or sp.max_attempts
    end
    -- Its first claim: a spec and no fence yet. Mostly a fresh job; also one parked before it
    -- was ever claimed (a dead parent) and requeued, whose hash holds a state but none of the
    -- spec's fields a finished record needs (keep_payload, result_ttl_ms, max_attempts, task).
    local first = sp ~= false and f[10] == false
    if first and (int_once('enqueued_ms', sp.enqueued_ms, 0, LIM.time_ms) == nil
        or (sp.result_ttl_ms ~= '' and parse_int(sp.result_ttl_ms, 1, LIM.ttl_ms) == nil)) then
      return nil, 'invalid job: record'
    end
    local r = { task = f[1], payload = f[2], backoff = f[6] or '', timeout_ms = f[7] or '0',
      schedule = f[8] or '', state = f[9], token = f[11], settled_token = f[12], settled = f[13],
      settled_log = f[14], fresh = fresh, first = first, spec = sp,
      lapses = parse_int(f[18], 0, LIM.fence) or 0 }  -- advisory: a hand edit reads as 0
    -- A schedule's run keeps its start deadline in its hash (lib/rearm.lua sched_job), not in
    -- spec flags; a hand edit that is no time reads as none.
    if f[19] then r.start_by = parse_int(f[19], 0, LIM.time_ms) end
    -- Flow fields are advisory: one edited by hand reads as unset (lib/flow.lua). A plain job
    -- has none of the three, and its flow is read no further; a flow job reads only the limits
    -- its key or rate window needs (flow_rest): the plain path's HMGET stays as it was.
    r.flow = FLOW_PLAIN
    if f[15] or f[16] or f[17] then r.flow = flow_rest(jk, f[15], f[16], f[17]) end
    if not task_seen[f[1]] then
      if not task_ok(f[1]) then return nil, 'invalid job: task' end
      task_seen[f[1]] = true
    end
    if not f[2] or not is_utf8(f[2]) then return nil, 'invalid job: payload' end
    r.attempts = int_once('attempts', f[3], 0, LIM.attempts)
    if r.attempts == nil then return nil, 'invalid job: attempts' end
    r.max_attempts = int_once('max_attempts', f[4], 1, LIM.attempts)
    if r.max_attempts == nil then return nil, 'invalid job: max_attempts' end
    r.run_at_ms = int_once('run_at_ms', f[5], 0, LIM.time_ms)
    if r.run_at_ms == nil then return nil, 'invalid job: run_at_ms' end
    -- Its text for the hash and the reply: a never-claimed job's is claim's own fmt of the due
    -- score (canonical); one read from a hash is written out again (a hand edit may say '007').
    r.run_at_s = (fresh and f[5] == run_at_s) and run_at_s or fmt(r.run_at_ms)
    if r.backoff ~= '' and not backoff_seen[r.backoff] then
      if parse_backoff(r.backoff) == nil then return nil, 'invalid job: backoff' end
      backoff_seen[r.backoff] = true
    end
    if not timeout_seen[r.timeout_ms] then
      if parse_int(r.timeout_ms, 0, LIM.timeout_ms) == nil then return nil, 'invalid job: timeout_ms' end
      timeout_seen[r.timeout_ms] = true
    end
    if r.schedule ~= '' and not schedule_name_ok(r.schedule) then
      return nil, 'invalid job: schedule'
    end
    -- HINCRBY fence would fail the whole script on a non-integer or at 2^63.
    if f[10] and parse_int(f[10], 0, LIM.fence - 1) == nil then return nil, 'invalid job: fence' end
    return r
  end
end

-- Park a job claim cannot hand out. A key that is not a hash cannot take the dead fields: it
-- only leaves due and goes on the dead list (doctor reports it).
local function park(id, jk, reason, schedule)
  -- A schedule's pending occurrence that ends here must not end the schedule: arm the next.
  local name = schedule
  if not schedule_name_ok(name) then name = string.match(id, '^schedule:([%w_.%-]+):%d+$') end
  if name then sched_ended(prefix, name, id, now_ms()) end
  if reason == 'invalid job: not a hash' then
    dead_letter_id(prefix, id, now_ms())
  else
    dead_letter(prefix, id, reason, now_ms())
  end
  flow_parent_ended(prefix, id, 'dead', now_ms())
  result_wake(prefix, id, 'dead', RESULT_WAKE_DEAD_TTL_MS)
end

-- A hostile score (inf, 1e300) must not reach the reply: next_ms stays a plain integer.
local function score_ms(v)
  local x = tonumber(v)
  if x == nil or x ~= x or x < 0 then return 0 end
  return math.min(math.floor(x), LIM.time_ms)
end

-- A suspect runs on a worker holding no other (below): a job whose lease lapsed twice (two
-- crashed batches), or once when the lease taken is its last attempt. With the second rule
-- alone, max_attempts 2 parked an innocent batch-mate 'lease expired' with the poison job at
-- its second lapse, before it ever ran alone. `attempts`: the count with this lease's.
local function suspect_at(r, attempts)
  return r.lapses >= 2 or (r.lapses >= 1 and attempts >= r.max_attempts)
end

local replay_key = prefix .. 'claim:' .. nonce
local now
-- 0. A re-sent call (redis-py retries after a timeout) gets the first call's jobs back, with
--    the same tokens, as long as it still holds them (and they still read well); it changes
--    nothing.
do
  local replay = redis.call('GET', replay_key)
  now = now_ms()
  if replay then
    local words = {}
    for w in string.gmatch(replay, '%S+') do words[#words + 1] = w end
    local out, suspect, drain = {}, nil, nil
    for i = 3, #words do
      local id = words[i]
      -- '!<id>': the drain the first call told (a job id has no '!').
      if string.sub(id, 1, 1) == '!' then drain = string.sub(id, 2) else
        local r = read_claimable(id, job_key(prefix, id))
        if r and r.state == 'leased' and r.token
            and string.sub(r.token, -#nonce - 1) == '-' .. nonce
            and string.find(r.token, '^%d+%-%w+$') then
          pack_job(out, id, r.token, r.attempts, r)
          if suspect_at(r, r.attempts) then suspect = id end
        end
      end
    end
    local reply = { words[1], words[2], #out / CLAIM_FIELDS }
    for _, v in ipairs(out) do reply[#reply + 1] = v end
    reply[#reply + 1] = scard_or_0(sched_refill_key(prefix))
    if suspect or drain then reply[#reply + 1] = suspect or '' end
    if drain then reply[#reply + 1] = drain end
    return reply
  end
end

-- A full server (maxmemory, noeviction) refuses only a script's first write that may grow
-- memory: the reap's first write (ZREM) may not, and the whole claim went on at a full server.
-- This SET may (a no-op: XX, and the key is missing here), so a full server refuses the claim
-- before any write, as docs/durability.md says.
redis.call('SET', replay_key, '', 'XX')

-- 1. Reap lapsed leases: due again now, or parked when the crashes used up the attempts. A job
--    whose counts cannot be read goes back to due, where step 2 parks it with the reason.
local parked = 0
do
  local lapsed = redis.pcall('ZRANGE', leased, '-inf', now, 'BYSCORE', 'LIMIT', 0, reap_limit,
    'WITHSCORES')
  if lapsed.err then return corrupt_err('leased', 'zset') end
  -- Before the first write (Redis keeps a script's writes made before an error): due, which the
  -- reaper and the held jobs a freed slot lets go write, and the dead set any park writes (one
  -- ZCARD each per call). A key edited into another type refuses the claim whole (CorruptKey,
  -- which a worker backs off from): nothing half-reaped.
  local err = zset_err(prefix, 'due') or dead_err(prefix)
  if err then return err end
  for i = 1, #lapsed, 2 do
    local id = lapsed[i]
    local until_ms = score_ms(lapsed[i + 1])
    local jk = job_key(prefix, id)
    -- The lapse count (f[3]) and the flow fields (f[4] .. f[9]): the moves below need them,
    -- read once here.
    local f = redis.pcall('HMGET', jk, 'attempts', 'max_attempts', 'lapses', unpack(FLOW_READ))
    if f.err then
      park(id, jk, 'invalid job: not a hash', '')
      parked = parked + 1
    else
      if not f[2] then
        -- This layout's default budget is in the spec alone (first claim copies only another):
        -- read from the record's head, not its payload.
        local sp = job_spec(prefix, id, '0', true)
        f[2] = sp and sp.max_attempts
      end
      local attempts = parse_int(f[1], 0, LIM.attempts)
      local max_attempts = parse_int(f[2], 1, LIM.attempts)
      local fl = FLOW_PLAIN
      if f[4] or f[5] or f[7] then fl = flow_from(f, 4) end
      if attempts ~= nil and max_attempts ~= nil and attempts >= max_attempts then
        dead_letter(prefix, id, 'lease expired', now)
        flow_release(prefix, id, now, fl)
        flow_parent_ended(prefix, id, 'dead', now)
        result_wake(prefix, id, 'dead', RESULT_WAKE_DEAD_TTL_MS)
        parked = parked + 1
      else
        flow_to_due(prefix, id, until_ms, now, fl)
        -- Counted with HSET of the strictly parsed value (HINCRBY would raise on a hand edit).
        redis.call('HSET', jk, 'state', 'due', 'lapses', fmt((parse_int(f[3], 0, LIM.fence - 1)
          or 0) + 1))
        redis.call('HDEL', jk, 'worker')
      end
    end
  end
  bump_stat(prefix, now, 'expired', #lapsed / 2)
end

-- A paused queue (queue_pause.lua) leases nothing; the reaper above still runs. A config key
-- of another type (edited by hand) is no pause: doctor reports the key.
local paused
do
  local conf = redis.pcall('HMGET', prefix .. 'config', 'paused_ms', 'dead_max_age_ms',
    'dead_max_count')
  if conf.err then conf = {} end
  paused = conf[1] and true or false
  if paused then limit = 0 end
  -- The opt-in dead-letter retention (lib/job.lua dead_trim) applied here too, not only when a
  -- job is parked: a queue that stopped failing would keep its dead letters past their age.
  if conf[2] or conf[3] then
    local zset = dead_zset(prefix, now)
    if zset == prefix .. 'dead' then dead_trim(prefix, zset, now) end
  end
end

-- Parents' ends left for later (a parent of more waiting children than one script may reach:
-- lib/flow.lua FLOW_END_STEP): the next step, before leasing, so a child it frees may be leased.
flow_ending_step(prefix, now)

-- 2. Lease due jobs in flow order (lib/flow.lua flow_fill): aged first, then by priority, oldest
--    run_at first; a job whose key or rate window is full is set aside, still due. With no flow
--    in use this is the plain FIFO scan.
local out = {}
local took = {}  -- the ids leased (#took: how many)
local now_s = fmt(now)
local suspect_taken = false  -- the suspect this call leased (its id)
local skipped = {}  -- suspects left due: this worker holds one already
-- The suspect this worker holds: when it was leased (since: its claimed_ms), whether this call
-- met a due job older than that (older: next_ms below), whether it is on its last attempt so
-- this worker is leased nothing (frozen); and the last-attempt suspect this worker is to drain
-- for (drain, header). One table: the main function's locals are near Lua's limit.
local mine = { since = nil, older = false, frozen = false, drain = nil }
-- A function, called once: its locals (the leasing's closures and state) are its own, not the
-- main function's (above).
local function lease_due()
  local lease_until = now + lease_ms
  local isolated_key = prefix .. 'isolated'
  flow_rate_due(prefix, now, limit)
  local leases = {}
  local taken_final = false  -- the suspect taken is on its last attempt
  -- The reply's payload bytes are bounded too, not only its job count: a claim stops taking
  -- jobs once the payloads it took reach `left` (4 MiB, docs/limits.md; the job that passes it
  -- is taken, so the first always is). 100 payloads of 512 KiB in one call held the server
  -- ~1 s (4 s of UTF-8 text) and made a 50 MiB reply. `cut`: a due job was left for the next
  -- claim, which the worker sends at once (next_ms: the due head, now).
  local payload_room = { left = 4194304, cut = false }
  -- The suspect this worker holds (isolated: worker -> job id) counts only while that job is
  -- still leased to it (a completed, failed or lapsed one frees the worker): read once, on the
  -- first suspect met. A key of another type (edited by hand) reads as empty.
  -- Its value is '!<id>' for a last-attempt suspect (held_final).
  local held_suspect, held_final
  local function suspect_held()
    if held_suspect == nil then
      held_suspect = false
      local v = redis.pcall('HGET', isolated_key, worker)
      local jid = type(v) == 'string' and string.match(v, '^!?(.+)$')
      if jid and redis.call('ZSCORE', leased, jid)
          and redis.pcall('HGET', job_key(prefix, jid), 'worker') == worker then
        held_suspect, held_final = true, string.sub(v, 1, 1) == '!'
        mine.since = parse_int(redis.pcall('HGET', job_key(prefix, jid), 'claimed_ms'), 0,
          LIM.time_ms)
      end
    end
    return held_suspect
  end
  -- A worker holding a last-attempt suspect runs it alone: nothing more until it ends. One
  -- HGET a call, unless the worker says it holds nothing.
  if holding ~= 0 and suspect_held() and held_final then
    mine.frozen = true
    return
  end
  -- The drain for last-attempt suspect `id` (header): one worker at a time, for lease_ms, is
  -- told to; nil when another one is. A value that does not read is taken over.
  local function drain_for(jk, id)
    local v = redis.pcall('HGET', jk, 'drainer')
    local at, w
    if type(v) == 'string' then at, w = string.match(v, '^(%d+) (.+)$') end
    -- A mark further ahead than any lease (hand-edited) is not honoured.
    at = at and parse_int(at, 0, LIM.time_ms)
    if at and at > now and at <= now + LIM.lease_ms and w ~= worker then return nil end
    redis.pcall('HSET', jk, 'drainer', fmt(now + lease_ms) .. ' ' .. worker)
    return id
  end
  -- A candidate claim cannot hand out is parked ('gone').
  local function drop(id, jk, bad, r)
    -- A job claim cannot read may still be a key's (let out of its hold for a free slot): its
    -- flow fields, read before the park (whose retention may delete the hash); a key that is
    -- not a hash has none.
    local fl = r and r.flow
    if not fl then
      local v = redis.pcall('HMGET', jk, unpack(FLOW_READ))
      fl = (not v.err) and flow_from(v, 1) or FLOW_PLAIN
    end
    park(id, jk, bad, r and r.schedule or '')
    parked = parked + 1
    -- A parked job of a key frees nothing it held, but a held job may wait for this slot.
    if fl.ckey ~= '' or fl.ckey_lost then flow_release(prefix, id, now, fl) end
    flow_unindex(prefix, id, fl.priority)
    return 'gone'
  end
  -- Jobs enqueued together share a due score, and most claims count attempt 1: each text is
  -- made once per run of equal values.
  local score_was, score_s, attempts_was, attempts_s
  local function examine(id, score)
    local jk = job_key(prefix, id)
    if payload_room.left <= 0 then
      -- Left due, unread and unwritten. 'took' tells flow_fill the batch is full, so its scan
      -- ends here; it drops a job's entry in its priority level's index before asking (a job
      -- met by that level's scan), so the entry goes back (a job met in due's scan has it
      -- already, or was left out on purpose: a skipped suspect, put out again when met).
      payload_room.cut = true
      local p = redis.pcall('HGET', jk, 'priority')
      p = type(p) == 'string' and parse_int(p, 1, FLOW_LIM.priority)
      if p then flow_index(prefix, id, p, score) end
      return 'took'
    end
    if score ~= score_was then score_was, score_s = score, fmt(score_ms(score)) end
    local r, bad = read_claimable(id, jk, score_s)
    if r and r.attempts >= r.max_attempts then bad = 'attempts exhausted' end
    -- No attempt starts after the job's start deadline (enqueue's start_within_ms): parked,
    -- visibly, instead of run late; a lapsed lease reaped after it ends the same way.
    if not bad and r.spec and r.spec.flags ~= '' and r.spec.flags ~= 'k' then
      local _, deadline = spec_flags(r.spec.flags)
      if deadline and now > deadline then
        bad = 'start deadline passed'
        -- Never claimed: its dead record says so, and when it was due (the spec alone did).
        if r.fresh then
          redis.call('HSET', jk, 'attempts', '0', 'run_at_ms', r.run_at_s, 'task', r.task)
          spec_pin_enqueued(prefix, id, r.run_at_s)  -- its '' read as the due score it leaves
        end
      end
    end
    if bad then return drop(id, jk, bad, r) end
    -- A suspect (suspect_at): one per worker at a time; else it stays due for another,
    -- re-scored to now (never before its score): behind every job due before now, so more
    -- suspects than a scan's budget at the head of due cannot use up every claim's scan and
    -- starve the jobs behind them; still due, for any worker that may take it.
    local suspect = r.lapses > 0 and suspect_at(r, r.attempts + 1)  -- most never lapsed
    -- On its last attempt: alone (header). A worker that did not say what it holds (nil) takes
    -- it as the first job of its call.
    local final = suspect and r.attempts + 1 >= r.max_attempts
    if final and ((holding and holding > 0) or #took > 0 or suspect_taken)
        or suspect and (suspect_taken or suspect_held()) then
      if final and holding and not mine.drain then
        mine.drain = drain_for(jk, id)
        -- Told to drain: nothing more in this call (the rest left due, as past the byte bound).
        if mine.drain then payload_room.left = 0 end
      end
      skipped[#skipped + 1] = id
      if mine.since and score_ms(score) < mine.since then mine.older = true end
      local later = now
      local s = tonumber(score)
      if s and s > later then later = s end
      redis.call('ZADD', due, 'XX', later, id)
      -- Out of its priority index (flow_fill dropped it when met there): each claim's level
      -- pass would meet it again and spend its budget before the lower levels; due's last
      -- pass still reaches it, for a worker that may take it (it waits at no priority).
      flow_unindex(prefix, id, r.flow.priority)
      return 'skip'
    end
    local fl = r.flow
    local flowing = flow_used(fl)
    if flowing then
      -- Set aside (false), or parked when a flow key it needs is of another type (nil).
      local ok, why = flow_admit(prefix, id, jk, fl, r.run_at_ms, now)
      if ok == nil then return drop(id, jk, why, r) end
      if not ok then return 'held' end
    end
    if r.schedule ~= '' then
      local go = sched_rearm(prefix, r.schedule, id, now)
      if go == nil then
        -- Its cron buffer ends before now: it stays due until the refill this reply asks for
        -- (lib/rearm.lua), back in its priority index as a skipped suspect is.
        flow_index(prefix, id, r.flow.priority, score)
        return 'skip'
      end
      -- A schedule's occurrence: the next one was inserted above; this late one was dropped
      -- by the schedule's misfire policy (lib/rearm.lua).
      if not go then
        flow_unindex(prefix, id, r.flow.priority)
        -- It may have been let out of its key's hold for a free slot: the key's next held job
        -- takes that slot (else it waits, nothing leased, until the next run of the key ends).
        if r.flow.ckey ~= '' then flow_release(prefix, id, now, r.flow) end
        -- Marked cancelled (skipped='misfire'): listed among the finished, as long as its
        -- record is kept, and a result() waiting on it hears so.
        finished_add(prefix, now, { now + SCHED_DROP_TTL_MS, id })
        result_wake(prefix, id, 'cancelled', SCHED_DROP_TTL_MS)
        return 'gone'
      end
    end
    -- A schedule's run past its start deadline (its hash's start_by_ms: the schedule's
    -- start_within_ms) is parked as an enqueued job's is. After the misfire policy: a run the
    -- policy drops after an outage stays a misfire skip, and the next run is armed already
    -- (sched_rearm above), so the schedule goes on.
    if r.start_by and now > r.start_by then return drop(id, jk, 'start deadline passed', r) end
    -- Leased below: the worker's one suspect (one set aside, parked or dropped above is not).
    if suspect then suspect_taken = id end
    -- Nothing more in this call (the rest left due, as past the byte bound).
    if final then taken_final, payload_room.left = true, 0 end
    local attempts = r.attempts + 1
    if attempts ~= attempts_was then attempts_was, attempts_s = attempts, fmt(attempts) end
    -- The last settlement moves to the replay log before a new one can overwrite it.
    if r.settled_token then log_settlement(jk, r.settled_token, r.settled, r.settled_log) end
    local token
    if r.first then
      -- First claim: the hash is born with the lease and the spec fields its readers need
      -- once the spec is gone (a lean finished job: task, max_attempts if not 5) or that change
      -- (run_at_ms; enqueued_ms, a copy of the first run_at); backoff and timeout_ms are read
      -- from the spec, which lives as long as the job is not done (lib/job.lua).
      token = '1-' .. nonce
      local sp = r.spec
      redis.call('HSET', jk, 'state', 'leased', 'token', token, 'worker', worker,
        'attempts', attempts_s, 'claimed_ms', now_s, 'fence', '1', 'task', r.task,
        'run_at_ms', r.run_at_s, 'enqueued_ms', sp.enqueued_ms)
      -- The default budget (5) is not stored: readers of a finished job fill it in
      -- (models.Job.max_attempts), the others read the spec.
      if r.max_attempts ~= 5 then redis.call('HSET', jk, 'max_attempts', fmt(r.max_attempts)) end
      if sp.result_ttl_ms ~= '' then redis.call('HSET', jk, 'result_ttl_ms', sp.result_ttl_ms) end
      if spec_flags(sp.flags) then redis.call('HSET', jk, 'keep_payload', '1') end
    else
      token = fmt(redis.call('HINCRBY', jk, 'fence', 1)) .. '-' .. nonce
      redis.call('HSET', jk, 'state', 'leased', 'token', token, 'worker', worker,
        'attempts', attempts_s, 'claimed_ms', now_s)
    end
    if final then redis.call('HDEL', jk, 'drainer') end
    took[#took + 1] = id
    leases[#leases + 1] = lease_until
    leases[#leases + 1] = id
    if flowing then flow_leased(prefix, id, fl, now, lease_until, token) end
    pack_job(out, id, token, attempts, r)
    payload_room.left = payload_room.left - #r.payload
    return 'took'
  end
  -- A worker draining for a last-attempt suspect (ARGV[7]): that one first. Back with nothing
  -- held, it takes it, else a backlog's older jobs would fill its call and skip it again; still
  -- holding jobs, it is told to drain on (its mark renewed), and takes nothing (below).
  local first = holding and ARGV[7]
  if first and first ~= '' then
    local s = redis.call('ZSCORE', due, first)
    if s and tonumber(s) <= now and examine(first, s) == 'took' then first = 'took' end
  end
  if first ~= 'took' and not mine.drain then flow_fill(prefix, due, now, limit, examine) end
  flow_rate_settle(now)  -- trims and expiry of the rate logs written above, once each
  -- Cut by bytes: more is due now, as after a full batch (below): another idle worker may take
  -- it.
  if payload_room.cut then wake(KEYS[5]) end
  if #took > 0 then
    call_chunked('ZREM', due, took)
    call_chunked('ZADD', leased, leases)
  end
  if suspect_taken then
    -- Advisory (pcall): a key of another type only loses the one-suspect rule for a while.
    -- Entries whose suspect ended go first: a worker killed by its suspect never comes back to
    -- free its own (worker ids are per process), and the expiry below is refreshed by every
    -- suspect taken, so the hash would grow with every process that ever held one. Left: the
    -- workers holding one now (suspect_held's check).
    local entries = redis.pcall('HGETALL', isolated_key)
    for i = 1, (entries.err and 0 or #entries), 2 do
      local w, jid = entries[i], string.match(entries[i + 1], '^!?(.*)$')
      if w ~= worker and not (redis.call('ZSCORE', leased, jid)
          and redis.pcall('HGET', job_key(prefix, jid), 'worker') == w) then
        redis.call('HDEL', isolated_key, w)
      end
    end
    redis.pcall('HSET', isolated_key, worker, (taken_final and '!' or '') .. suspect_taken)
    redis.pcall('PEXPIRE', isolated_key, 86400000)  -- and once no suspect is taken, all go
    -- Suspects left due: another idle worker may take one. Only a call that took one pushes
    -- this, so workers that each hold one do not wake each other in turn.
    if #skipped > 0 then wake(KEYS[5]) end
  end
end
if limit > 0 then lease_due() end
bump_stat(prefix, now, 'dead', parked)
bump_stat(prefix, now, 'claim', #took)
record_lateness(prefix, now, out)  -- per call: the minute's start lateness (lib/lateness.lua)

local next_ms = -1
do
  -- The due head, past the suspects this worker may not take: they are no reason for it to come
  -- back before its own suspect's lease ends (the leased head below bounds that wait), else an
  -- idle worker would claim in a loop. Among the first #skipped + 1 the first other one is it.
  local dh = paused and {} or redis.call('ZRANGE', due, 0, #skipped, 'WITHSCORES')
  if (#skipped > 0 or mine.frozen) and #took == 0 then
    -- Nothing this worker may take within the scan's budget (suspects all of it, e.g. after a
    -- fleet crashed twice): the due head is no reason to come back, else every claim would be
    -- answered "due now" at once.
    dh = {}
    -- Unless its scan moved suspects due before it took its own and jobs due before then are
    -- left: those its scans have not met since (a skipped suspect's new score is later), maybe
    -- plain ones: it comes back at once. Each such call moves a scan's worth out of that span
    -- and none come in, so this ends; a scan that met none (all since) sleeps as below.
    if mine.older then
      local h = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
      if h[2] and score_ms(h[2]) < mine.since then dh = h end
    end
    if not dh[2] then
      -- A job enqueued due now behind a suspect this worker may not take gets no wake-up
      -- (enqueue.lua wakes for a job due before the head, here overdue;
      -- tests/test_review_time_inputs.py): the worker comes back this soon at most, one claim a
      -- second while it holds a suspect and skips others.
      local SUSPECT_POLL_MS = 1000
      next_ms = now + SUSPECT_POLL_MS
      -- Or sooner, at the first job due after now (a skipped suspect is scored now at most: no
      -- claim loop).
      dh = redis.call('ZRANGE', due, '(' .. now_s, '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
    end
  elseif #skipped > 0 then
    local skip = {}
    for i = 1, #skipped do skip[skipped[i]] = true end
    local k = 1
    while dh[k] and skip[dh[k]] do k = k + 2 end
    dh = { dh[k], dh[k + 1] }
  end
  if dh[2] and (next_ms == -1 or score_ms(dh[2]) < next_ms) then next_ms = score_ms(dh[2]) end
  -- A full batch means more may be waiting: pass the wake-up on to another idle worker, also
  -- for a job due soon (that worker planned its sleep before this call). Due later than the
  -- workers' idle safety net (scheduler/worker/settings.py _MAX_IDLE_SLEEP_S), its next claim
  -- sees it anyway.
  if limit > 0 and #took == limit and next_ms ~= -1 and next_ms <= now + 30000 then wake(KEYS[5]) end
  local lh = redis.call('ZRANGE', leased, 0, 0, 'WITHSCORES')
  if lh[2] and (next_ms == -1 or score_ms(lh[2]) < next_ms) then next_ms = score_ms(lh[2]) end
  -- A rate-limited job's next slot: the worker sleeps until then instead of polling.
  local slot = not paused and flow_next_slot(prefix)
  if slot and (next_ms == -1 or slot < next_ms) then next_ms = slot end
end

if #took > 0 then
  -- Only the ids are kept for a replay: the rest is re-read (and re-checked) from the hashes then;
  -- and the drain told, as '!<id>'.
  local told = mine.drain and (' !' .. mine.drain) or ''
  redis.call('SET', replay_key,
    now_s .. ' ' .. fmt(next_ms) .. ' ' .. table.concat(took, ' ') .. told, 'PX', lease_ms)
end
local reply = { now_s, fmt(next_ms), #took }
for i = 1, #out do reply[#reply + 1] = out[i] end
-- Trailing flag: schedules wait for the client to refill their cron buffers (lib/rearm.lua).
reply[#reply + 1] = scard_or_0(sched_refill_key(prefix))
-- Then the suspect this call leased: the worker claims again when it ends. Then the drain.
if suspect_taken or mine.drain then reply[#reply + 1] = suspect_taken or '' end
if mine.drain then reply[#reply + 1] = mine.drain end
return reply
