--[[ complete: record success for leases the caller holds, many in one call.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, stats:<minute>, config, result:<id>, result_wait:<id>, flow:levels, flow:pdue:<p>, flow:ck:<key>, flow:ckheld:<key>, flow:held, flow:waiting, flow:children:<id>, flow:ending, flow:ending:<word>:<id>, finished
  ARGV[1] result_ttl_ms   how long the outcome record (state, result, finished_ms) is kept, and
    the result wake-up `result:<id>` (lib/result.lua) that Queue.result() waits on, unless the
    job was enqueued with its own (hash field result_ttl_ms, copied from its spec at claim);
    the job's id joins the finished index (lib/result.lua) until then
  A finished job is lean: only what status/result and a re-sent complete need stay (state,
    result, finished_ms, settled_token/settled/settled_log, attempts, max_attempts (stored
    only when not the default 5: readers fill it in, models.Job.max_attempts), task,
    run_at_ms, schedule/slot_ms);
    the payload, the spec and the lease fields go, unless the job asked to keep its payload
    (hash field keep_payload = '1', from the spec's flag 'k'): then the whole job is kept.
  then triples: id, token, result (JSON text)
  Returns: one status per job: 'done' | 'stale' | 'cancelled' | 'missing'.
    A stale token changes nothing. A re-sent call with the same token answers 'done' again.
  Errors:  BAD_ARGUMENT <field>=<value>; CORRUPT due is not a zset (a job with a concurrency key
    or children, when due was edited by hand into another type: nothing written) ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/lease.lua"
-- @include "lib/flow.lua"
-- @include "lib/result.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, leased = KEYS[1], KEYS[3]
-- What a lean finished job loses (scheduler/core/models.py LEAN_DROPPED names them for readers).
-- max_attempts stays when claim stored it (not 5): status and inspection read attempts
-- against it.
local LEAN_DROP = { 'payload', 'backoff', 'timeout_ms', 'enqueued_ms',
  'claimed_ms', 'worker', 'token', 'fence', 'idem', 'errors', 'last_error_type', 'last_error',
  'result_ttl_ms' }
-- A job of this version's layout (its hash has no backoff: that stays in the spec) holds only
-- these of them; HDEL scans the listpack once per name, so it is not asked for the others.
local LEAN_DROP_SPEC = { 'enqueued_ms', 'claimed_ms', 'worker', 'token', 'fence', 'errors',
  'last_error_type', 'last_error', 'result_ttl_ms' }
-- lease_check's fields, then what the settlement needs: one HMGET per job.
local READ = { 'token', 'state', 'settled_token', 'settled', 'settled_log',
  'result_ttl_ms', 'keep_payload', 'ckey', 'kids', 'backoff' }
local ttl, err = int_arg(ARGV[1], 'result_ttl_ms', 1, LIM.ttl_ms)
if err then return err end
if #ARGV % 3 ~= 1 then return redis.error_reply('BAD_ARGUMENT argc=' .. #ARGV) end
local now = now_ms()
local out, took, seen, held = {}, {}, {}, {}
local now_s = fmt(now)
for i = 2, #ARGV, 3 do
  local id, token = ARGV[i], ARGV[i + 1]
  local status, outcome, f = lease_check(prefix, id, token, READ)
  if status == 'settled' then
    status = (outcome == 'done') and 'done' or 'stale'
  elseif status == 'held' then
    if not seen[id] then
      took[#took + 1] = i
      held[i] = f
      seen[id] = true
    end
    status = 'done'
  end
  out[#out + 1] = status
end
-- A freed key slot or a parent's end moves held jobs into due after the first write below:
-- due checked before it (a key edited by hand refuses the call, nothing written).
for _, i in ipairs(took) do
  if held[i][8] or held[i][9] then
    local bad = zset_err(prefix, 'due')
    if bad then return bad end
    break
  end
end
if #took > 0 then
  -- First write frees memory: on a full server (noeviction) Redis refuses a script whose first
  -- write grows memory, but lets the rest of a script run once it has written; so running jobs
  -- can still be settled at the limit.
  local ids = {}
  for k, i in ipairs(took) do ids[k] = ARGV[i] end
  call_chunked('ZREM', leased, ids)
  local finished = {}
  for _, i in ipairs(took) do
    local id = ARGV[i]
    local jk = job_key(prefix, id)
    local f = held[i]
    -- Its concurrency slot is free: the key's oldest held job is due again (lib/flow.lua);
    -- jobs waiting for it count it done.
    if f[8] then flow_release(prefix, id, now, flow_keyed(jk, f[8])) end
    if f[9] then flow_parent_done(prefix, id, now) end
    local job_ttl = parse_int(f[6], 1, LIM.ttl_ms) or ttl
    local lean = f[7] ~= '1'
    if lean then
      redis.call('HDEL', jk, unpack(f[10] and LEAN_DROP or LEAN_DROP_SPEC))
      redis.call('DEL', spec_key(prefix, id))
    else
      redis.call('HDEL', jk, 'worker')  -- held by none (models.Job.worker); the rest is kept
    end
    -- settled_token/settled: a re-sent call with this token is answered 'done' again.
    redis.call('HSET', jk, 'state', 'done', 'result', ARGV[i + 2], 'finished_ms', now_s,
      'settled_token', ARGV[i + 1], 'settled', 'done')
    -- A lean job has no spec left to expire: one PEXPIRE, not lib job_expire's two.
    if lean then redis.call('PEXPIRE', jk, job_ttl) else job_expire(prefix, id, job_ttl) end
    result_wake(prefix, id, 'done', job_ttl)
    finished[#finished + 1] = now + job_ttl
    finished[#finished + 1] = id
  end
  finished_add(prefix, now, finished)
end
local done = #took
bump_stat(prefix, now, 'done', done)
return out
