-- Does the caller still hold the lease on `id` with `token`?
-- Returns one of:
--   'held'               token matches and the job is leased (an unexpired or lapsed-but-unreaped lease)
--   'settled', outcome   this token already settled the lease (a re-sent call): replay the answer
--   'stale'              another claim holds the job now, or the lapsed lease was reaped
--   'cancelled'          the job was cancelled while leased
--   'missing'            no such job
local function lease_check(prefix, id, token)
  local f = redis.call('HMGET', prefix .. 'job:' .. id, 'token', 'state', 'settled_token', 'settled')
  if not f[2] then return 'missing' end
  if f[3] == token then return 'settled', f[4] end
  if f[1] ~= token then return 'stale' end
  if f[2] == 'cancelled' then return 'cancelled' end
  if f[2] ~= 'leased' then return 'stale' end
  return 'held'
end

-- Record that `token` settled its lease with `outcome`, so a re-sent call gets the same answer.
local function settle(jk, token, outcome)
  redis.call('HSET', jk, 'settled_token', token, 'settled', outcome)
end
