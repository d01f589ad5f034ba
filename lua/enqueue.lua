--[[ enqueue: accept one or more jobs (enqueue_many sends a batch in one call).
  KEYS[1] prefix   STRING  'sched:{<queue>}:' (job and idempotency keys are built from it)
  KEYS[2] due      ZSET    id -> run_at_ms
  KEYS[3] leased   ZSET    id -> lease_until_ms
  KEYS[4] dead     ZSET    dead id -> dead_ms
  KEYS[5] wake     LIST    wake-up tokens for idle workers
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, stats:<minute>, idem:<digest>, dead:migrating, config, partitions, flow:levels, flow:pdue:<p>, flow:held, flow:waiting, flow:children:<id>, moving
  ARGV[1] n, then 13 fields per job (12, without flow, from an older client):
    id, task, payload (JSON text), when ('at' | 'in'), time_ms (absolute run_at_ms for 'at',
    delay_ms from server now for 'in'), max_attempts, backoff ('base_ms,factor,cap_ms,jitter'
    with factor >= 1 and jitter in [0, 1]), timeout_ms (0 = none), idem (hex digest or ''),
    idem_ttl_ms, result_ttl_ms ('' = the completing worker's), flags (optionally 'b': debounce,
    with a key and no flow; then '' | 'k': keep the payload once done; then optionally 'w' and a
    start window in ms, 1 .. LIM.delay_ms: the job is parked, not run, when no attempt has
    started by run_at + window), flow ('' = none, else 'priority|ckey|climit|rkey|rate_count|
    rate_window_ms|parents', lib/flow.lua flow_arg; a flow job also gets a hash holding only its
    flow fields, and a priority > 0 puts it in its level's index). Parents (space-separated
    ids, earlier jobs of this queue or of this call; one of this call whose idempotency key was
    taken stands for the job the key names, its id in the reply) must exist: a job waits in
    flow:held / flow:waiting until all are done, and is parked at once if one already ended
    dead or cancelled (lib/flow.lua flow_wait); one a queue move has taken (in `moving`) is
    refused, BAD_ARGUMENT after=<id> (being moved to another queue). A job is written as one STRING spec:<id> (lib/job.lua pack_spec), no
    hash until its first claim. Every number must be a plain decimal integer within the ranges of
    lib/util.lua LIM (= scheduler/codec.py LIMITS, docs/limits.md); at most MAX_BATCH jobs.
  Returns: {flags, then (index, id) pairs}: flags has one character per job, 'c' created or 'e'
    already there (the client made the ids, so a re-sent call finds them: same state). When an
    idempotency key is already taken (it lasts idem_ttl_ms past the first job's run_at), the
    first job's id is given as an (index, id) pair and nothing changes for that job; with the
    'b' flag (debounce) that job, while no attempt of it started (never claimed, or given back
    unstarted: released with its attempt returned), takes this call's spec and run time
    instead ('u', its id in a pair), and otherwise the key moves to this call's new job. A job
    waiting for parents holds its key from the latest run time they have at this call.
  Errors:  BAD_ARGUMENT <field>=<value>, CORRUPT <key> (a stored key of the wrong type); nothing
    written either way ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/flow.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, due, wake_key = KEYS[1], KEYS[2], KEYS[5]
-- 15-20 us a job: a call of 1,000 holds the server about 20 ms (10,000 held it 150-180 ms,
-- every client waiting); enqueue_many sends more as several calls.
local MAX_BATCH = 1000  -- scheduler/core/limits.py ENQUEUE_PER_CALL
local now = now_ms()
local n, err = int_arg(ARGV[1], 'n', 1, MAX_BATCH)
if err then return err end
err = partitioned_err(prefix)
if err then return err end
-- 13 fields per job; 12 (no flow field) from a client of the version before flow control.
local W = 13
if #ARGV == 1 + n * 12 then W = 12 end
if #ARGV ~= 1 + n * W then return redis.error_reply('BAD_ARGUMENT argc=' .. #ARGV) end

-- Validate the whole batch before the first write (same ranges as scheduler/codec.py).
-- A batch mostly repeats one task name and one backoff text: each distinct one is checked once.
local jobs, task_seen, debounced = {}, {}, {}
-- The default backoff (most jobs') is known good: a record stores it as ''.
local backoff_seen = { [SPEC_BACKOFF] = true }
-- And a number field mostly repeats its text from job to job: each field remembers its last
-- text and value (Lua strings are interned: the comparison is one pointer; issue 16, bulk).
-- It starts from the defaults the client sends (scheduler/core/codec.py): a one-job call
-- with them parses none of them.
local last_text = { time_ms = '0', max_attempts = '5', timeout_ms = '0', idem_ttl_ms = '86400000' }
local last_value = { time_ms = 0, max_attempts = 5, timeout_ms = 0, idem_ttl_ms = 86400000 }
local function int_field(v, name, lo, hi)
  if last_text[name] == v then return last_value[name] end
  local x, bad = int_arg(v, name, lo, hi)
  if bad then return nil, bad end
  last_text[name], last_value[name] = v, x
  return x
end
for i = 0, n - 1 do
  local b = 1 + i * W
  local id, task, when, backoff = ARGV[b + 1], ARGV[b + 2], ARGV[b + 4], ARGV[b + 7]
  if not job_id_ok(id) then return redis.error_reply('BAD_ARGUMENT id=' .. string.sub(id, 1, 40)) end
  -- Schedules' runs only (lib/rearm.lua): one enqueued there would be taken over by its run.
  if string.find(id, '^schedule:') then return redis.error_reply('BAD_ARGUMENT id=' .. string.sub(id, 1, 40)) end
  if #ARGV[b + 9] > 128 or (ARGV[b + 9] ~= '' and not string.find(ARGV[b + 9], '^%w+$')) then
    return redis.error_reply('BAD_ARGUMENT idem=')
  end
  if not task_seen[task] then
    if not task_ok(task) then return redis.error_reply('BAD_ARGUMENT task=' .. string.sub(task, 1, 40)) end
    task_seen[task] = true
  end
  local t, max_attempts, timeout, idem_ttl
  if when == 'in' then
    t, err = int_field(ARGV[b + 5], 'time_ms', 0, LIM.delay_ms); if err then return err end
    t = now + t
  elseif when == 'at' then
    t, err = int_arg(ARGV[b + 5], 'time_ms', 0, LIM.time_ms); if err then return err end
  else
    return redis.error_reply('BAD_ARGUMENT when=' .. string.sub(when, 1, 40))
  end
  if t > LIM.time_ms then return redis.error_reply('BAD_ARGUMENT time_ms=' .. fmt(t)) end
  max_attempts, err = int_field(ARGV[b + 6], 'max_attempts', 1, LIM.attempts)
  if err then return err end
  if not backoff_seen[backoff] then
    if parse_backoff(backoff) == nil then
      return redis.error_reply('BAD_ARGUMENT backoff=' .. string.sub(backoff, 1, 60))
    end
    backoff_seen[backoff] = true
  end
  timeout, err = int_field(ARGV[b + 8], 'timeout_ms', 0, LIM.timeout_ms); if err then return err end
  idem_ttl, err = int_field(ARGV[b + 10], 'idem_ttl_ms', 1, LIM.ttl_ms); if err then return err end
  if ARGV[b + 11] ~= '' then
    local _, bad = int_field(ARGV[b + 11], 'result_ttl_ms', 1, LIM.ttl_ms)
    if bad then return bad end
  end
  -- flags: 'b' (debounce: replace the unstarted job the key names), then 'k' (keep the
  -- payload), then 'w' and a start window in ms: the spec stores the deadline it makes,
  -- run_at + window (lib/job.lua spec_flags).
  local flags, debounce = ARGV[b + 12], false
  if flags ~= '' and string.byte(flags) == 98 then  -- 98: 'b'
    flags, debounce = string.sub(flags, 2), true
    if ARGV[b + 9] == '' or (W == 13 and ARGV[b + 13] ~= '') then
      return redis.error_reply('BAD_ARGUMENT debounce=needs a key and no flow options')
    end
    -- One call debounces a key once: which of two would win is no order a caller could rely on.
    if debounced[ARGV[b + 9]] then
      return redis.error_reply('BAD_ARGUMENT debounce=one key twice in one call')
    end
    debounced[ARGV[b + 9]] = true
  end
  if flags ~= '' and flags ~= 'k' then
    local keep, window = string.match(flags, '^(k?)w(%d+)$')
    window = window and parse_int(window, 1, LIM.delay_ms)
    if not window then
      return redis.error_reply('BAD_ARGUMENT flags=' .. string.sub(flags, 1, 40))
    end
    flags = keep .. 'd' .. fmt(math.min(t + window, LIM.time_ms))
  end
  local flow, bad_flow = flow_arg(W == 13 and ARGV[b + 13] or '')
  if flow == nil then return bad_flow end
  jobs[i + 1] = { id, task, ARGV[b + 3], t, max_attempts, backoff, timeout, ARGV[b + 9], idem_ttl,
    ARGV[b + 11], flags, flow }
  -- Only a debounced job gets the named field: a plain job's table stays an array.
  if debounce then jobs[i + 1].debounce = true end
end

-- Idempotency keys are read before any write too (a key overwritten with another type would
-- make GET fail half-way through the writes below): j.first = the job a taken key names, the id
-- the reply gives for this job. A key taken earlier in this call names that call's job.
-- `held`: ids an earlier job of this call writes or finds already there (the write loop answers
-- a repeat 'e', so a repeat takes no key either). A key holds '<job id>', then the last
-- CALLS_KEPT debounced calls: '<call id>' replaced that job, '<call id>=<job id>' created or
-- replaced an earlier job of the key (ids have no '='). Such a call re-sent (its answer lost)
-- is answered with its job, not run again as a new one nor over a newer call's data, also
-- once the key moved on to a new job.
local keyed, held = {}, {}
local CALLS_KEPT = 8
local function calls_after(calls, id, job)  -- the entries kept, this call's last
  local ids = {}
  for w in string.gmatch(calls, '%S+') do
    -- A new job: the entries of the key's former job name it.
    if job and not string.find(w, '=', 1, true) then w = w .. '=' .. job end
    ids[#ids + 1] = w
  end
  ids[#ids + 1] = id
  return table.concat(ids, ' ', math.max(1, #ids - CALLS_KEPT + 1))
end
-- Debounce replaces the job a key names while no attempt of it has started: a spec and no hash
-- (never claimed), or a hash holding only the `kids` mark of jobs enqueued after=[it]
-- (lib/flow.lua flow_wait: they wait for the id, which the replacement keeps); or one a worker
-- gave back unstarted (release.lua: a graceful stop's prefetched jobs, a claim whose answer was
-- lost): due with attempts 0, its last lease settled 'released', no lease, and no field but
-- those a claim and a release write (a run's progress, error, lapse or result, a flow field or
-- a schedule: not replaced). Returns false (no hash to change), true (a hash given back) or
-- nil (not replaceable; a key of another type neither).
local GIVEN_BACK = { state = 1, token = 1, attempts = 1, claimed_ms = 1, fence = 1, task = 1,
  run_at_ms = 1, enqueued_ms = 1, max_attempts = 1, result_ttl_ms = 1, keep_payload = 1,
  settled_token = 1, settled = 1, settled_log = 1, kids = 1 }
local function unstarted(jk, id)
  local all = redis.pcall('HGETALL', jk)
  if all.err then return nil end
  local h = {}
  for i = 1, #all, 2 do
    if not GIVEN_BACK[all[i]] then return nil end
    h[all[i]] = all[i + 1]
  end
  if #all == 0 or (#all == 2 and h.kids) then return false end
  if h.state ~= 'due' or h.attempts ~= '0' or not h.token or h.settled ~= 'released'
      or h.settled_token ~= h.token then
    return nil
  end
  -- A lease (a hand edit of the state) or a leased key of another type: not given back.
  if redis.pcall('ZSCORE', KEYS[3], id) ~= false then return nil end
  return true
end
for _, j in ipairs(jobs) do
  if j[8] ~= '' then
    local r = redis.pcall('GET', prefix .. 'idem:' .. j[8])
    if type(r) == 'table' and r.err then
      return corrupt_err('idem:' .. j[8], 'string')
    end
    local calls
    if r then r, calls = string.match(r, '^(%S+) ?(.*)$') end
    -- A key an earlier job of this call took names that job now (not the one stored before).
    j.first = keyed[j[8]] or r
    if j.debounce and keyed[j[8]] then
      -- Replacing a job this very call writes: two calls' worth in one, refused (as a key
      -- debounced twice) rather than answered with the first job and this data dropped.
      return redis.error_reply('BAD_ARGUMENT debounce=a key an earlier job of this call took')
    end
    -- Debounce: the job the key names (an earlier call's) is replaced by this one while no
    -- attempt of it has started (`unstarted`, waiting in due, its spec there); once one has
    -- (running, retrying, finished, gone), this call's job is written as new and the key names it.
    local seen = r and (' ' .. calls .. ' ')
    local at = j.debounce and r and r ~= j[1] and not string.find(seen, ' ' .. j[1] .. ' ', 1, true)
      and string.find(seen, ' ' .. j[1] .. '=', 1, true)
    if at then  -- a re-sent call of an earlier job of the key: that job
      j.first = string.match(seen, '^(%S+)', at + #j[1] + 2)
    elseif j.debounce and r and r ~= j[1]
        and not string.find(seen, ' ' .. j[1] .. ' ', 1, true) then
      local given = unstarted(job_key(prefix, r), r)
      if redis.call('EXISTS', job_key(prefix, j[1])) == 1
          or redis.call('EXISTS', spec_key(prefix, j[1])) == 1 then
        j.first = j[1]  -- the call that made this job, re-sent after the key moved on
      elseif given ~= nil and redis.call('EXISTS', spec_key(prefix, r)) == 1
          and redis.call('ZSCORE', due, r) then
        j.replace, j.calls, j.rehash = r, calls, given
      else  -- a new job: the key keeps the calls of the one it named (r's own call is r)
        j.first, j.carry = nil, ' ' .. calls_after(calls, r .. '=' .. r, r)
      end
    end
    -- Two one-key EXISTS, as in the write loop below (a job already there takes no key).
    if not j.first and not held[j[1]] and redis.call('EXISTS', job_key(prefix, j[1])) == 0
        and redis.call('EXISTS', spec_key(prefix, j[1])) == 0 then
      keyed[j[8]] = j[1]
    end
  end
  if not j.first then held[j[1]] = true end
end

-- Parents (after=[ids]) are looked up before any write too: a missing one refuses the call. A
-- parent of this call whose key was taken is the job the key names (`alias`): the child waits
-- for that one, as the reply's id for the parent says (else it waited for an id never written).
-- A job the write loop answers 'e' (its key taken, or its id already there or earlier in this
-- call) writes nothing: its parents are not looked up, so re-sending a whole batch stays
-- idempotent after a parent finished and expired.
local in_batch, alias = {}, {}
local waits = false  -- some job of this call waits for parents (window_from reads `starts`)
for _, j in ipairs(jobs) do
  if j[12].after and not j.first and not in_batch[j[1]]
      and redis.call('EXISTS', job_key(prefix, j[1])) == 0
      and redis.call('EXISTS', spec_key(prefix, j[1])) == 0 then
    local parents, bad_parent = flow_parents(prefix, j[12].after, in_batch, alias)
    if parents == nil then return bad_parent end
    j[13], waits = parents, true
  end
  -- An id this call writes is that job, for its children, whichever job of the call (one not
  -- written, its key taken, or the one that writes it) names it first.
  if not j.first then
    in_batch[j[1]], alias[j[1]] = true, nil
  elseif not in_batch[j[1]] then
    alias[j[1]] = j.first
  end
end

-- A job given back unstarted keeps its hash (its fence; the settlement a re-sent release is
-- answered from). The spec fields its first claim copied there, which claim reads over the
-- spec, follow the replacing spec, as that claim would have written them from it.
local function rehash(jk, task, max_attempts, run_at, result_ttl_ms, flags)
  redis.call('HSET', jk, 'task', task, 'run_at_ms', fmt(run_at), 'enqueued_ms', fmt(now))
  redis.call('HDEL', jk, 'max_attempts', 'result_ttl_ms', 'keep_payload')
  if max_attempts ~= 5 then redis.call('HSET', jk, 'max_attempts', fmt(max_attempts)) end
  if result_ttl_ms ~= '' then redis.call('HSET', jk, 'result_ttl_ms', result_ttl_ms) end
  if spec_flags(flags) then redis.call('HSET', jk, 'keep_payload', '1') end
end

-- A job waiting for parents runs no earlier than the latest of them: its key's window starts
-- at the latest run time they have now (due or set aside, a parent of this call its own start:
-- a chain of waits), not at its own run_at, or it ended before the job could run. A parent
-- running now adds nothing; one rescheduled later, or waiting behind a later job of an
-- earlier call, is not foreseen. Scores are read strictly: a hand edit (inf, nan) is ignored.
local starts = {}
local function window_from(run_at, parents)
  local from = run_at
  for _, pr in ipairs(parents) do
    if pr[2] == 'pending' then
      local t = starts[pr[1]]
      if not t then
        t = redis.call('ZSCORE', due, pr[1]) or redis.call('ZSCORE', prefix .. 'flow:held', pr[1])
        t = t and tonumber(t)
      end
      if t and t > from and t <= LIM.time_ms then from = math.floor(t) end
    end
  end
  return from
end

local head = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
local head_ms = head[2] and tonumber(head[2]) or nil
local earliest = nil
local flags, subst, adds = {}, {}, {}
local last_run_at, run_at_s
for k, j in ipairs(jobs) do
  local id, task, payload, run_at, max_attempts, backoff, timeout, idem, idem_ttl =
    j[1], j[2], j[3], j[4], j[5], j[6], j[7], j[8], j[9]
  local jk, sk = job_key(prefix, id), spec_key(prefix, id)
  local ik = (idem ~= '') and (prefix .. 'idem:' .. idem) or nil
  local first = j.first
  if j.replace then
    -- The latest call wins: its spec, its run time (the key held from it), the same id.
    redis.call('SET', spec_key(prefix, first), pack_spec(task, max_attempts, backoff, timeout,
      now, run_at, j[10], j[11], payload))
    if j.rehash then rehash(job_key(prefix, first), task, max_attempts, run_at, j[10], j[11]) end
    if waits then starts[first] = run_at end
    adds[#adds + 1] = fmt(run_at)
    adds[#adds + 1] = first
    redis.call('SET', ik, first .. ' ' .. calls_after(j.calls, id), 'PX',
      math.max(run_at - now, 0) + idem_ttl)
    flags[k] = 'u'
    subst[#subst + 1] = k
    subst[#subst + 1] = first
    if earliest == nil or run_at < earliest then earliest = run_at end
  elseif first then
    -- The key is taken for its whole window, even after the first job finished and expired.
    flags[k] = 'e'
    subst[#subst + 1] = k
    subst[#subst + 1] = first
  -- Two one-key EXISTS, not one two-key call: after `EXISTS jk sk` the SET below stores the
  -- record 16 B larger (Redis 7.0, the Lua argument-object reuse; bench/memory_layouts.py).
  -- Not `SET ... NX` either: a re-sent batch of jobs already there must write nothing, so a
  -- full server (OOM, NOREPLICAS: Redis refuses a script's first write) still answers it.
  elseif redis.call('EXISTS', jk) == 1 or redis.call('EXISTS', sk) == 1 then
    flags[k] = 'e'
  else
    -- A batch's jobs mostly share one run time: its text is made once per run of equal times.
    if run_at ~= last_run_at then last_run_at, run_at_s = run_at, fmt(run_at) end
    -- One compact record, defaults and derivable fields left out (lib/job.lua pack_spec).
    redis.call('SET', sk, pack_spec(task, max_attempts, backoff, timeout, now,
      run_at, j[10], j[11], payload))
    if flow_used(j[12]) then flow_store(jk, j[12]) end
    -- A job with parents not all done waits (or is parked at once: lib/flow.lua flow_wait).
    if not (j[13] and flow_wait(prefix, id, jk, run_at, j[13], now)) then
      adds[#adds + 1] = run_at_s
      adds[#adds + 1] = id
      if flow_used(j[12]) then flow_index(prefix, id, j[12].priority, run_at) end
    end
    local from = j[13] and window_from(run_at, j[13]) or run_at
    if waits then starts[id] = from end
    if ik then
      redis.call('SET', ik, id .. (j.carry or ''), 'PX', math.max(from - now, 0) + idem_ttl)
    end
    flags[k] = 'c'
    if earliest == nil or run_at < earliest then earliest = run_at end
  end
end
call_chunked('ZADD', due, adds)
if earliest ~= nil and (head_ms == nil or earliest < head_ms) then wake(wake_key) end
local reply = { table.concat(flags) }
for _, v in ipairs(subst) do reply[#reply + 1] = v end
return reply
