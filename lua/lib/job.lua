-- Job keys and job-level moves shared by several transitions: the only place a script formats
-- a job key (tests/test_lua_layout.py checks it). Membership in due / leased / dead is the
-- truth; the hash's `state` field is a copy written by the same script.
-- @include "lib/util.lua"

local function job_key(prefix, id)
  return prefix .. 'job:' .. id
end

-- Park a job for a human: out of due and leased, onto the dead list (newest first).
local function dead_letter(prefix, id, reason, now)
  redis.call('ZREM', prefix .. 'due', id)
  redis.call('ZREM', prefix .. 'leased', id)
  redis.call('HSET', job_key(prefix, id), 'state', 'dead', 'dead_reason', reason,
    'dead_ms', fmt(now))
  redis.call('LPUSH', prefix .. 'dead', id)
end

-- Take an id off the dead list; the number of entries removed (0: it was not there). The one
-- place (with dead_letter, dead_letter_id, dead_size) that knows the dead key's type.
local function dead_unlist(prefix, id)
  return redis.call('LREM', prefix .. 'dead', 0, id)
end

local function dead_size(prefix)
  return redis.call('LLEN', prefix .. 'dead')
end

-- Out of leased (if there), into due at run_at: retry, release, a reaped lease, a requeue.
local function to_due(prefix, id, run_at)
  redis.call('ZREM', prefix .. 'leased', id)
  redis.call('ZADD', prefix .. 'due', run_at, id)
end

-- Park an id whose key is not a hash (it cannot take the dead fields): out of due and leased,
-- onto the dead list by id alone (doctor reports it).
local function dead_letter_id(prefix, id)
  redis.call('ZREM', prefix .. 'due', id)
  redis.call('ZREM', prefix .. 'leased', id)
  redis.call('LPUSH', prefix .. 'dead', id)
end

-- The 10 reply fields of one leased job, in the order claim's contract header gives
-- (scheduler's codec reads them in this order): appended to `out`.
local function pack_job(out, id, token, attempts, r)
  local b = #out
  out[b + 1] = id; out[b + 2] = token; out[b + 3] = attempts; out[b + 4] = r.max_attempts
  out[b + 5] = r.task; out[b + 6] = r.payload; out[b + 7] = fmt(r.run_at_ms)
  out[b + 8] = r.backoff; out[b + 9] = r.timeout_ms; out[b + 10] = r.schedule
end

-- Append one entry to the job's error history (JSON array, newest last, at most 10 kept).
local function push_error(jk, etype, message, traceback, attempt, now)
  local raw = redis.call('HGET', jk, 'errors')
  local errs = {}
  if raw then
    local ok, decoded = pcall(cjson.decode, raw)
    if ok and type(decoded) == 'table' then errs = decoded end
  end
  errs[#errs + 1] = { type = etype, message = message, traceback = traceback,
    attempt = attempt, at_ms = fmt(now) }
  while #errs > 10 do table.remove(errs, 1) end
  redis.call('HSET', jk, 'errors', cjson.encode(errs), 'last_error_type', etype,
    'last_error', message)
end
