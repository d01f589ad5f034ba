-- @include "lib/job.lua"
-- Does the caller still hold the lease on `id` with `token`?
-- Returns one of:
--   'held'               token matches and the job is leased (an unexpired or lapsed-but-unreaped lease)
--   'settled', outcome   this token already settled the lease (a re-sent call): replay the answer
--   'stale'              another claim holds the job now, or the lapsed lease was reaped
--   'cancelled'          the job was cancelled while leased
--   'missing'            no such job
-- A settlement is kept in settled_token/settled; when a later claim leases the job again, claim
-- moves it into settled_log (see log_settlement), so a call re-sent after the job moved on (it was
-- released, claimed by another worker and completed) still gets its first answer, not 'stale'.
-- `names` (optional): LEASE_FIELDS followed by more fields read in the same HMGET; 'held' also
-- returns that HMGET's reply (the extra values from index 6 on), so the caller reads once.
local LEASE_FIELDS = { 'token', 'state', 'settled_token', 'settled', 'settled_log' }
local function lease_check(prefix, id, token, names)
  -- pcall: a job key overwritten with another type must not fail the whole batch (the other
  -- jobs' completes): it answers 'missing'.
  local f = redis.pcall('HMGET', job_key(prefix, id), unpack(names or LEASE_FIELDS))
  if f.err then return 'missing' end
  -- No hash: a job never claimed (its spec record alone) is held by nobody.
  if not f[2] then
    return redis.call('EXISTS', spec_key(prefix, id)) == 1 and 'stale' or 'missing'
  end
  if f[3] == token then return 'settled', f[4] end
  if f[5] then
    local _, stop = string.find('\n' .. f[5], '\n' .. token .. '\t', 1, true)
    if stop then
      local rest = string.sub('\n' .. f[5], stop + 1)
      return 'settled', string.match(rest, '^[^\n]*')
    end
  end
  if f[1] ~= token then return 'stale' end
  if f[2] == 'cancelled' then return 'cancelled' end
  if f[2] ~= 'leased' then return 'stale' end
  return 'held', nil, f
end

-- Record that `token` settled its lease with `outcome`, so a re-sent call gets the same answer.
local function settle(jk, token, outcome)
  redis.call('HSET', jk, 'settled_token', token, 'settled', outcome)
end

-- Called by claim before it leases a job again: keep the last settlements ('token\toutcome\n',
-- newest first, at most SETTLED_LOG_MAX) so settle() overwriting them loses no replay answer.
local SETTLED_LOG_MAX = 8
local function log_settlement(jk, settled_token, settled, old_log)
  -- Already logged by an earlier claim (its lease lapsed and was reaped, no new settlement).
  if old_log and string.sub(old_log, 1, #settled_token + 1) == settled_token .. '\t' then return end
  local log = settled_token .. '\t' .. (settled or '') .. '\n' .. (old_log or '')
  local kept, n = {}, 0
  for line in string.gmatch(log, '[^\n]+') do
    n = n + 1
    if n > SETTLED_LOG_MAX then break end
    kept[n] = line
  end
  redis.call('HSET', jk, 'settled_log', table.concat(kept, '\n') .. '\n')
end
