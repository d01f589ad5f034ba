-- Job-level moves shared by several transitions. Membership in due / leased / dead is the
-- truth; the hash's `state` field is a copy written by the same script.

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
