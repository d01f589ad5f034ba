--[[ move_in: the second step of moving waiting jobs (move_out.lua): write each job, as the
  source queue stored it, into this queue with the same id and run time. Idempotent by id: a
  job already here (a rerun re-sending a batch whose answer was lost) is left as it is. The
  ids written (or found here) are kept in `move_in:<source>` until the caller's finish
  (scheduler/admin/queue_move_check.py forget_delivered): a rerun re-sending one that ran here
  since and whose record expired, or was cancelled here, is answered 'e', not written again.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, config, partitions, moving, move_in:<source>
  ARGV[1] n (1 .. MAX_BATCH), ARGV[2] the source queue's name, ARGV[3] the run's fencing
    epoch ('' = a caller holding no lock: not checked; else refused, MOVE_STALE, below one
    already seen from that source: config `move_epoch:<source>`), then 4 fields per job: id,
    run_at_ms, spec text ('' = none: a
    hash-only job), hash fields as a JSON array [field, value, ...] ('[]' = none: a job never
    claimed); a job needs a spec or a hash
  Returns: flags, one character per job: 'c' written, 'e' already here (the same job: task and
    enqueued_ms match, the task alone for a finished job's lean hash or a spec kept with no
    run time (cancelled before any claim), whose id must be in `move_in:<source>`: a rerun's; or no record
    but its id in `move_in:<source>`: delivered by this move, ended here since), 'x' another job holds the id here (nothing written: the
    caller puts the job back into the source's due), 'm' this queue's own `moving` set holds
    the id and its record (config `move_to`) names the caller's source: a move the other way,
    between its steps, deletes the job here once it is there, so an 'e' would lose it (nothing
    written, the caller puts it back). Held in `moving` toward another queue, the same job
    answers 'e' (it was delivered here and goes on: the caller deletes its copy)
  Errors:  BAD_ARGUMENT <field>=<value> (a spec this version cannot read among them);
    MOVE_STALE epoch=<e> seen=<s> (an earlier run's put: nothing written); CORRUPT
    due | moving is not a zset, config is not a hash, move_in:<source> is not a set (edited by
    hand); nothing written either
    way ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, due, wake_key = KEYS[1], KEYS[2], KEYS[5]
local MAX_BATCH = 1000  -- scheduler/admin/queue_move.py MOVE_PER_CALL
local n, err = int_arg(ARGV[1], 'n', 1, MAX_BATCH)
if err then return err end
local source = table.remove(ARGV, 2)
if type(source) ~= 'string' or #source > 64 or not string.find(source, '^[%w_%.%-]+$') then
  return redis.error_reply('BAD_ARGUMENT from=' .. string.sub(tostring(source), 1, 40))
end
local epoch = table.remove(ARGV, 2)
if type(epoch) ~= 'string' or (epoch ~= '' and not parse_int(epoch, 1, 9007199254740991)) then
  return redis.error_reply('BAD_ARGUMENT epoch=' .. string.sub(tostring(epoch), 1, 40))
end
if #ARGV ~= 1 + n * 4 then return redis.error_reply('BAD_ARGUMENT argc=' .. #ARGV) end
-- A partitioned queue's name holds no jobs: the caller writes into its partitions.
err = partitioned_err(prefix)
if err then return err end
local delivered = prefix .. 'move_in:' .. source
err = zset_err(prefix, 'due') or zset_err(prefix, 'moving')
  or key_type_err(prefix .. 'config', 'config', 'hash')
  or key_type_err(delivered, 'move_in:' .. source, 'set')
if err then return err end
local moving = prefix .. 'moving'
-- A move the other way (from here to the caller's source) holds its jobs in `moving`.
local back_to = redis.call('HGET', prefix .. 'config', 'move_to') == source

-- Every job is checked before the first write.
local jobs = {}
for i = 0, n - 1 do
  local b = 1 + i * 4
  local id, spec = ARGV[b + 1], ARGV[b + 3]
  if not job_id_ok(id) then return redis.error_reply('BAD_ARGUMENT id=' .. string.sub(id, 1, 40)) end
  local run_at
  run_at, err = int_arg(ARGV[b + 2], 'run_at_ms', 0, LIM.time_ms)
  if err then return err end
  if spec ~= '' and not read_spec(spec, ARGV[b + 2]) then
    return redis.error_reply('BAD_ARGUMENT spec=' .. string.sub(spec, 1, 40))
  end
  local ok, fields = pcall(cjson.decode, ARGV[b + 4])
  if not ok or type(fields) ~= 'table' or #fields % 2 ~= 0 then
    return redis.error_reply('BAD_ARGUMENT fields=' .. string.sub(ARGV[b + 4], 1, 40))
  end
  for _, v in ipairs(fields) do
    if type(v) ~= 'string' then return redis.error_reply('BAD_ARGUMENT fields=not text') end
  end
  if spec == '' and #fields == 0 then return redis.error_reply('BAD_ARGUMENT record=none') end
  jobs[#jobs + 1] = { id, run_at, spec, fields }
end

-- Which job an id names: task and enqueued_ms of its hash, else of its spec record (a
-- never-claimed job's enqueued_ms is its run time when the record leaves it out). A finished
-- job's lean hash has no enqueued_ms: its task alone then.
local function identity(fields, spec, run_at_s)
  local task, enq = fields.task, fields.enqueued_ms
  if spec and spec ~= '' and not (task and enq) then
    local sp = read_spec(spec, run_at_s)
    if sp then task, enq = task or sp.task, enq or sp.enqueued_ms end
  end
  -- A spec that leaves enqueued_ms out (its run time) read with no run time (a job here in
  -- neither due nor moving: cancelled before any claim) gives ''; unknown, as a lean hash's.
  if enq == '' then enq = nil end
  return task, enq
end
local function same_job(a_task, a_enq, b_task, b_enq)
  return a_task ~= nil and a_task == b_task and (a_enq == nil or b_enq == nil or a_enq == b_enq)
end
local function stored_identity(jk, sk, id)
  local h = redis.pcall('HMGET', jk, 'task', 'enqueued_ms')
  if type(h) ~= 'table' or h.err then h = {} end
  local spec = redis.pcall('GET', sk)
  if type(spec) ~= 'string' then spec = nil end
  local at = redis.pcall('ZSCORE', due, id)
  if type(at) ~= 'string' then at = redis.call('ZSCORE', moving, id) end  -- leaving: its time
  return identity({ task = h[1] or nil, enqueued_ms = h[2] or nil }, spec,
    type(at) == 'string' and at or '')
end

-- The run's fencing epoch (scheduler/admin/queue_move_lock.py: the server's time once it held
-- its locks; a later run takes them a lease later at least): a put of an earlier run than one
-- seen here (a run that lost its lock, paused between its renewal and this put) is refused,
-- nothing written. The highest seen stays in config (a field per source: a later run's end
-- must not let an earlier run's late put in).
if epoch ~= '' then
  local field = 'move_epoch:' .. source
  local seen = parse_int(redis.call('HGET', prefix .. 'config', field), 0, 9007199254740991) or 0
  if tonumber(epoch) < seen then
    return redis.error_reply('MOVE_STALE epoch=' .. epoch .. ' seen=' .. seen)
  end
  if tonumber(epoch) > seen then
    local r = write_refused(redis.pcall('HSET', prefix .. 'config', field, epoch), 'config', 'hash')
    if r then return r end
  end
end

local head = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
local head_ms = head[2] and tonumber(head[2]) or nil
local flags, adds, earliest, ours = {}, {}, nil, {}
for k, j in ipairs(jobs) do
  local id = j[1]
  local jk, sk = job_key(prefix, id), spec_key(prefix, id)
  if back_to and redis.call('ZSCORE', moving, id) then
    flags[k] = 'm'
  elseif redis.call('EXISTS', jk) == 1 or redis.call('EXISTS', sk) == 1 then
    local mine = {}
    for i = 1, #j[4], 2 do mine[j[4][i]] = j[4][i + 1] end
    local t1, e1 = identity(mine, j[3], fmt(j[2]))
    local t2, e2 = stored_identity(jk, sk, id)
    local same = same_job(t1, e1, t2, e2)
    -- A finished job's lean hash (no enqueued_ms) matches by task alone: only a rerun's (its
    -- id kept since its put) is that job; a new one reusing the id would be lost as 'e'.
    if same and e2 == nil then same = redis.call('SISMEMBER', delivered, id) == 1 end
    flags[k] = same and 'e' or 'x'
    if same then ours[#ours + 1] = id end
  elseif redis.call('SISMEMBER', delivered, id) == 1 then
    flags[k] = 'e'  -- put by this move before, ended here since: the caller deletes its copy
  else
    if j[3] ~= '' then redis.call('SET', sk, j[3]) end
    if #j[4] > 0 then call_chunked('HSET', jk, j[4]) end
    adds[#adds + 1] = fmt(j[2])
    adds[#adds + 1] = id
    flags[k] = 'c'
    ours[#ours + 1] = id
    if earliest == nil or j[2] < earliest then earliest = j[2] end
  end
end
call_chunked('ZADD', due, adds)
call_chunked('SADD', delivered, ours)
if earliest ~= nil and (head_ms == nil or earliest < head_ms) then wake(wake_key) end
return table.concat(flags)
