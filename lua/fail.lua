--[[ fail: record a failed attempt; retry after a backoff, or park the job in the dead list.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, stats:<minute>, dead:migrating, config, result:<id>, result_wait:<id>, flow:levels, flow:pdue:<p>, flow:ck:<key>, flow:ckheld:<key>, flow:held, flow:waiting, flow:children:<id>, flow:ending, flow:ending:<word>:<id>
  ARGV[1] id  ARGV[2] token
  ARGV[3] retryable  '1' | '0' (a non-retryable error parks the job at once)
  ARGV[4] error type  ARGV[5] error message  ARGV[6] traceback (already truncated)
  ARGV[7] u          uniform random number in [0, 1) drawn by the client, for the jitter
  ARGV[8] delay_ms   '' = the job's own backoff; else this delay
  Backoff: min(cap, base * factor ^ (attempts - 1)) * (1 - jitter * u), scheduled from server
    time (attempts is already counted at claim). Parks when attempts >= max_attempts, or when
    the retry would start after the job's start deadline (lib/job.lua spec_flags; a
    schedule's run: its hash's start_by_ms); a park pushes the result wake-up
    (lib/result.lua). A park the queue's dead retention deletes at once (lib/job.lua
    dead_trim) leaves no key of the job (a re-sent call answers 'missing').
  Returns: {status, run_at_ms or dead reason}; status is 'retry' | 'dead' | 'stale' |
    'cancelled' | 'missing'. A re-sent call with the same token gives the same answer.
  Errors:  BAD_ARGUMENT <field>=<value>; CORRUPT due | dead | dead:migrating is not a zset
    (nothing written: the key was edited by hand into another type) ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/lease.lua"
-- @include "lib/flow.lua"
-- @include "lib/result.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, due, leased = KEYS[1], KEYS[2], KEYS[3]
local id, token, retryable = ARGV[1], ARGV[2], ARGV[3]
local u = parse_num(ARGV[7], 0, 1)
if u == nil or u >= 1 then return redis.error_reply('BAD_ARGUMENT u=' .. ARGV[7]) end
local delay_override = nil
if ARGV[8] ~= '' then
  local d, err = int_arg(ARGV[8], 'delay_ms', 0, LIM.delay_ms)
  if err then return err end
  delay_override = d
end
local now = now_ms()
-- lease_check's fields, then what the settlement needs (f[6] .. f[12]): one HMGET of the job.
local READ = { 'token', 'state', 'settled_token', 'settled', 'settled_log',
  'attempts', 'max_attempts', 'backoff', 'priority', 'ckey', 'rkey', 'start_by_ms' }
local status, outcome, f = lease_check(prefix, id, token, READ)
if status == 'settled' then
  local kind, detail = string.match(outcome or '', '^(%a+):(.*)$')
  if kind == 'retry' or kind == 'dead' then return { kind, detail } end
  return { 'stale', '' }
end
if status ~= 'held' then return { status, '' } end

local jk = job_key(prefix, id)
-- The flow, read as claim reads it (a plain job has none of the three): flow_release and
-- flow_to_due take it instead of reading the job again.
local fl = FLOW_PLAIN
if f[9] or f[10] or f[11] then fl = flow_rest(jk, f[9], f[10], f[11]) end
-- Read strictly (claim checked them when it leased the job; a later hand edit counts as 1).
-- A job of this version's layout keeps backoff and a default max_attempts in the spec: read
-- from its head, with the flags (the start deadline); a retry or a park leaves the payload there.
local sp = false
if not f[7] or not f[8] then sp = job_spec(prefix, id, '0', true) end
local attempts = parse_int(f[6], 0, LIM.attempts) or 1
local max_attempts = parse_int(f[7] or (sp and sp.max_attempts), 1, LIM.attempts) or 1
local parks = retryable ~= '1' or attempts >= max_attempts
local reason = (retryable ~= '1') and 'non-retryable error' or 'attempts exhausted'
local run_at
if not parks then
  local delay = delay_override
  if delay == nil then
    -- 'base_ms,factor,cap_ms,jitter' as enqueue stored it; none stored (the first layout's
    -- backoff_* fields) is the default, as claim reports it; a hand-edited value means no delay.
    local p = parse_backoff(f[8] or (sp and sp.backoff) or SPEC_BACKOFF) or { 0, 1, 0, 0 }
    local base, factor, cap, jitter = p[1], p[2], p[3], p[4]
    delay = 0
    -- factor ^ n may overflow to inf: min() then gives cap (0 * inf would be nan, so base > 0).
    if base > 0 and cap > 0 then delay = math.min(cap, base * factor ^ (attempts - 1)) end
    delay = math.floor(delay * (1 - jitter * u))
  end
  run_at = now + delay
  -- A retry that could only start after the job's start deadline is parked now, not left to
  -- wait for a claim to park it then (claim's check stays the rule: lib/job.lua spec_flags).
  -- A schedule's run keeps its deadline in its hash (lib/rearm.lua sched_job).
  local deadline = f[12] and parse_int(f[12], 0, LIM.time_ms)
  if sp and sp.flags ~= '' and sp.flags ~= 'k' then deadline = select(2, spec_flags(sp.flags)) end
  if deadline and run_at > deadline then parks, reason = true, 'start deadline passed' end
end
-- Before the first write, the sets this call writes that may have been edited into another
-- type: due (the retry's ZADD, the park's ZREM) and, for a park, dead. leased needs no check:
-- its ZREM is the first write, so an error there has written nothing.
local bad = zset_err(prefix, 'due') or (parks and dead_err(prefix))
if bad then return bad end
if parks then
  -- First write frees memory, so a full server still lets a worker settle (see complete.lua).
  redis.call('ZREM', leased, id)
  push_error(jk, ARGV[4], ARGV[5], ARGV[6], attempts, now)
  redis.call('HDEL', jk, 'worker')
  -- Settled before the park: dead_letter's retention may delete this very job (max_count 0,
  -- or a same-ms tie broken by id), and nothing may write into its key after that (a write
  -- would re-create a hash of two fields, no spec, no expiry, the id blocked for good). A
  -- re-sent call then finds no record: 'missing', as for any job the retention removed.
  settle(jk, token, 'dead:' .. reason)
  dead_letter(prefix, id, reason, now)
  flow_release(prefix, id, now, fl)
  flow_parent_ended(prefix, id, 'dead', now)
  result_wake(prefix, id, 'dead', RESULT_WAKE_DEAD_TTL_MS)
  bump_stat(prefix, now, 'fail', 1)
  bump_stat(prefix, now, 'dead', 1)
  return { 'dead', reason }
end
-- The first write: out of leased (it frees memory, so a full server still lets a worker settle:
-- see complete.lua), then into due (checked above).
flow_to_due(prefix, id, run_at, now, fl)
push_error(jk, ARGV[4], ARGV[5], ARGV[6], attempts, now)
redis.call('HDEL', jk, 'worker')
redis.call('HSET', jk, 'state', 'due', 'run_at_ms', fmt(run_at))
settle(jk, token, 'retry:' .. fmt(run_at))
bump_stat(prefix, now, 'fail', 1)
bump_stat(prefix, now, 'retry', 1)
return { 'retry', fmt(run_at) }
