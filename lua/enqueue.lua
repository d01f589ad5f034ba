--[[ enqueue: accept one or more jobs (enqueue_many sends a batch in one call).
  KEYS[1] prefix   STRING  'sched:{<queue>}:' (job and idempotency keys are built from it)
  KEYS[2] due      ZSET    id -> run_at_ms
  KEYS[3] leased   ZSET    id -> lease_until_ms
  KEYS[4] dead     LIST    dead ids, newest first
  KEYS[5] wake     LIST    wake-up tokens for idle workers
  ARGV[1] n, then 13 fields per job:
    id, task, payload (JSON text), when ('at' | 'in'), time_ms (absolute run_at_ms for 'at',
    delay_ms from server now for 'in'), max_attempts, backoff_base_ms, backoff_factor,
    backoff_cap_ms, backoff_jitter (0..1), timeout_ms (0 = none), idem (hex digest or ''),
    idem_ttl_ms
  Returns: for each job {id, created (1 new | 0 already there)}; with an idempotency key that
    is already taken (it lasts idem_ttl_ms past the first job's run_at) the first job's id comes
    back and nothing changes. Re-sending the same
    call leaves the same state (ids are made by the client).
  Errors:  BAD_ARGUMENT <field>=<value> (nothing written) ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"

local prefix, due, wake_key = KEYS[1], KEYS[2], KEYS[5]
local now = now_ms()
local n, err = int_arg(ARGV[1], 'n', 1)
if err then return err end
local W = 13
if #ARGV ~= 1 + n * W then return redis.error_reply('BAD_ARGUMENT argc=' .. #ARGV) end

-- Validate the whole batch before the first write.
local jobs = {}
for i = 0, n - 1 do
  local b = 1 + i * W
  local j = { id = ARGV[b + 1], task = ARGV[b + 2], payload = ARGV[b + 3], when = ARGV[b + 4],
    backoff_factor = ARGV[b + 8], idem = ARGV[b + 12] }
  if j.id == '' then return redis.error_reply('BAD_ARGUMENT id=') end
  if j.task == '' then return redis.error_reply('BAD_ARGUMENT task=') end
  if j.when ~= 'at' and j.when ~= 'in' then
    return redis.error_reply('BAD_ARGUMENT when=' .. j.when)
  end
  local t
  t, err = int_arg(ARGV[b + 5], 'time_ms', j.when == 'in' and 0 or nil); if err then return err end
  j.run_at = (j.when == 'in') and (now + t) or t
  j.run_at_s = fmt(j.run_at)
  j.max_attempts, err = int_arg(ARGV[b + 6], 'max_attempts', 1); if err then return err end
  j.base, err = int_arg(ARGV[b + 7], 'backoff_base_ms', 0); if err then return err end
  local f = tonumber(j.backoff_factor)
  if f == nil or f < 1 then return redis.error_reply('BAD_ARGUMENT backoff_factor=' .. j.backoff_factor) end
  j.cap, err = int_arg(ARGV[b + 9], 'backoff_cap_ms', 0); if err then return err end
  local jit = tonumber(ARGV[b + 10])
  if jit == nil or jit < 0 or jit > 1 then return redis.error_reply('BAD_ARGUMENT backoff_jitter=' .. ARGV[b + 10]) end
  j.backoff = j.base .. ',' .. j.backoff_factor .. ',' .. j.cap .. ',' .. ARGV[b + 10]
  j.timeout, err = int_arg(ARGV[b + 11], 'timeout_ms', 0); if err then return err end
  j.idem_ttl, err = int_arg(ARGV[b + 13], 'idem_ttl_ms', 1); if err then return err end
  jobs[#jobs + 1] = j
end

local now_s = fmt(now)
local head = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
local head_ms = head[2] and tonumber(head[2]) or nil
local earliest = nil
local out, adds = {}, {}
for _, j in ipairs(jobs) do
  local id, created = j.id, 0
  local jk = prefix .. 'job:' .. id
  local ik = (j.idem ~= '') and (prefix .. 'idem:' .. j.idem) or nil
  local first = ik and redis.call('GET', ik)
  if first then
    -- The key is taken for its whole window, even after the first job finished and expired.
    id = first
  elseif redis.call('EXISTS', jk) == 0 then
    -- Defaults are not stored (claim fills them in): fewer fields, less memory per job.
    if j.timeout > 0 then
      redis.call('HSET', jk, 'task', j.task, 'payload', j.payload, 'state', 'due',
        'run_at_ms', j.run_at_s, 'enqueued_ms', now_s, 'attempts', 0,
        'max_attempts', j.max_attempts, 'backoff', j.backoff, 'timeout_ms', j.timeout)
    else
      redis.call('HSET', jk, 'task', j.task, 'payload', j.payload, 'state', 'due',
        'run_at_ms', j.run_at_s, 'enqueued_ms', now_s, 'attempts', 0,
        'max_attempts', j.max_attempts, 'backoff', j.backoff)
    end
    adds[#adds + 1] = j.run_at_s
    adds[#adds + 1] = id
    if ik then
      redis.call('HSET', jk, 'idem', j.idem)
      redis.call('SET', ik, id, 'PX', math.max(j.run_at - now, 0) + j.idem_ttl)
    end
    created = 1
    if earliest == nil or j.run_at < earliest then earliest = j.run_at end
  end
  out[#out + 1] = { id, created }
end
if #adds > 0 then redis.call('ZADD', due, unpack(adds)) end
if earliest ~= nil and (head_ms == nil or earliest < head_ms) then wake(wake_key) end
return out
