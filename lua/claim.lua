--[[ claim: lease up to `limit` due jobs to one worker. Lapsed leases are reaped on the same
  path first, so a job whose worker died is due again without any janitor process.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (as in enqueue.lua)
  ARGV[1] worker id
  ARGV[2] limit          jobs to lease at most (>= 0)
  ARGV[3] lease_ms       lease length (> 0)
  ARGV[4] nonce          random, unique per call: part of every token, and the replay key
  ARGV[5] reap_limit     lapsed leases handled per call at most
  Returns: {now_ms, next_ms, n, then 10 fields per job: id, token, attempts, max_attempts, task,
    payload, run_at_ms, backoff ('base_ms,factor,cap_ms,jitter' or ''), timeout_ms, schedule}. next_ms is the earliest time something may become claimable
    (head of due or of leased), or -1 when both are empty. After the jobs, one more number:
    how many schedules wait for a cron-buffer refill (advisory: read now, also in a replay).
    Claiming a schedule's pending occurrence inserts the next one in this same call, or drops
    a late one by the misfire policy (lib/rearm.lua).
    The token is '<fence>-<nonce>': the fence is a per-job counter bumped at every claim, and
    the nonce makes a token unique even if a failover loses the last increment.
    A re-sent call with the same nonce returns the first call's jobs (those it still holds) and
    changes nothing.
  Side effects: attempts is counted here, at claim; a job whose attempts are used up is parked
    with reason 'lease expired' (lapsed) or 'attempts exhausted'; a job hash that cannot be read
    (edited by hand) is parked with reason 'invalid job: <field>'.
  Errors:  BAD_ARGUMENT <field>=<value> ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/utf8.lua"
-- @include "lib/rearm.lua"

local prefix, due, leased, wake_key = KEYS[1], KEYS[2], KEYS[3], KEYS[5]
local worker, nonce = ARGV[1], ARGV[4]
local limit, lease_ms, reap_limit, err
limit, err = int_arg(ARGV[2], 'limit', 0); if err then return err end
lease_ms, err = int_arg(ARGV[3], 'lease_ms', 1); if err then return err end
reap_limit, err = int_arg(ARGV[5], 'reap_limit', 0); if err then return err end
if nonce == '' then return redis.error_reply('BAD_ARGUMENT nonce=') end

local replay_key = prefix .. 'claim:' .. nonce
local replay = redis.call('GET', replay_key)
local now = now_ms()

-- 0. A re-sent call (redis-py retries after a timeout) gets the first call's jobs back, with
--    the same tokens, as long as it still holds them; it changes nothing.
if replay then
  local words = {}
  for w in string.gmatch(replay, '%S+') do words[#words + 1] = w end
  local out = {}
  for i = 3, #words do
    local id = words[i]
    local f = redis.call('HMGET', job_key(prefix, id), 'task', 'payload', 'attempts',
      'max_attempts', 'run_at_ms', 'backoff', 'timeout_ms', 'schedule', 'token', 'state')
    if f[10] == 'leased' and f[9] and string.sub(f[9], -#nonce - 1) == '-' .. nonce then
      local b = #out
      out[b + 1] = id; out[b + 2] = f[9]; out[b + 3] = tonumber(f[3]); out[b + 4] = tonumber(f[4])
      out[b + 5] = f[1]; out[b + 6] = f[2]; out[b + 7] = f[5]; out[b + 8] = f[6] or ''
      out[b + 9] = f[7] or '0'; out[b + 10] = f[8] or ''
    end
  end
  local reply = { words[1], words[2], #out / 10 }
  for _, v in ipairs(out) do reply[#reply + 1] = v end
  reply[#reply + 1] = redis.call('SCARD', sched_refill_key(prefix))
  return reply
end

-- 1. Reap lapsed leases: due again now, or parked when the crashes used up the attempts.
local lapsed = redis.call('ZRANGE', leased, '-inf', now, 'BYSCORE', 'LIMIT', 0, reap_limit,
  'WITHSCORES')
local parked = 0
for i = 1, #lapsed, 2 do
  local id, until_ms = lapsed[i], lapsed[i + 1]
  local jk = job_key(prefix, id)
  local f = redis.call('HMGET', jk, 'attempts', 'max_attempts')
  local attempts, max_attempts = tonumber(f[1]), tonumber(f[2])
  if attempts ~= nil and max_attempts ~= nil and attempts >= max_attempts then
    dead_letter(prefix, id, 'lease expired', now)
    parked = parked + 1
  else
    redis.call('ZREM', leased, id)
    redis.call('ZADD', due, until_ms, id)
    redis.call('HSET', jk, 'state', 'due')
    redis.call('HDEL', jk, 'worker')
  end
end
bump_stat(prefix, now, 'lease_expired', #lapsed / 2)

-- 2. Lease due jobs, oldest run_at first.
local out = {}
local n = 0
local lease_until = now + lease_ms
local took = {}
local now_s = fmt(now)
if limit > 0 then
  local ids = redis.call('ZRANGE', due, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit)
  local leases = {}
  for _, id in ipairs(ids) do
    local jk = job_key(prefix, id)
    local f = redis.call('HMGET', jk, 'task', 'payload', 'attempts', 'max_attempts', 'run_at_ms',
      'backoff', 'timeout_ms', 'schedule', 'state')
    local attempts, max_attempts = tonumber(f[3]), tonumber(f[4])
    local bad = nil
    if f[9] == false then bad = 'job hash missing'
    elseif not f[1] or f[1] == '' then bad = 'invalid job: task'
    elseif not f[2] then bad = 'invalid job: payload'
    elseif not (is_utf8(f[1]) and is_utf8(f[2]) and is_utf8(f[6] or '') and is_utf8(f[8] or ''))
      then bad = 'invalid job: not UTF-8 text'
    elseif attempts == nil then bad = 'invalid job: attempts'
    elseif max_attempts == nil or max_attempts < 1 then bad = 'invalid job: max_attempts'
    elseif tonumber(f[5]) == nil then bad = 'invalid job: run_at_ms'
    elseif attempts >= max_attempts then bad = 'attempts exhausted'
    end
    if bad then
      dead_letter(prefix, id, bad, now)
      parked = parked + 1
    elseif f[8] and f[8] ~= '' and not sched_rearm(prefix, f[8], id, now) then
      -- A schedule's occurrence: the next one was inserted above; this late one was dropped
      -- by the schedule's misfire policy (lib/rearm.lua).
    else
      attempts = attempts + 1
      local fence = redis.call('HINCRBY', jk, 'fence', 1)
      local token = fence .. '-' .. nonce
      redis.call('HSET', jk, 'state', 'leased', 'token', token, 'worker', worker,
        'attempts', attempts, 'claimed_ms', now_s)
      took[#took + 1] = id
      leases[#leases + 1] = lease_until
      leases[#leases + 1] = id
      n = n + 1
      local b = #out
      out[b + 1] = id; out[b + 2] = token; out[b + 3] = attempts; out[b + 4] = max_attempts
      out[b + 5] = f[1]; out[b + 6] = f[2]; out[b + 7] = f[5]; out[b + 8] = f[6] or ''
      out[b + 9] = f[7] or '0'; out[b + 10] = f[8] or ''
    end
  end
  if n > 0 then
    redis.call('ZREM', due, unpack(took))
    redis.call('ZADD', leased, unpack(leases))
  end
  -- A full batch means more may be waiting: pass the wake-up on to another idle worker.
  if n == limit and redis.call('ZCOUNT', due, '-inf', now) > 0 then wake(wake_key) end
end
bump_stat(prefix, now, 'dead', parked)
bump_stat(prefix, now, 'claim', n)

local next_ms = -1
local dh = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
if dh[2] then next_ms = tonumber(dh[2]) end
local lh = redis.call('ZRANGE', leased, 0, 0, 'WITHSCORES')
if lh[2] and (next_ms == -1 or tonumber(lh[2]) < next_ms) then next_ms = tonumber(lh[2]) end

if n > 0 then
  -- Only the ids are kept for a replay: the rest is re-read from the hashes then.
  redis.call('SET', replay_key, now_s .. ' ' .. fmt(next_ms) .. ' ' .. table.concat(took, ' '),
    'PX', lease_ms)
end
local reply = { now_s, fmt(next_ms), n }
for _, v in ipairs(out) do reply[#reply + 1] = v end
-- Trailing flag: schedules wait for the client to refill their cron buffers (lib/rearm.lua).
reply[#reply + 1] = redis.call('SCARD', sched_refill_key(prefix))
return reply
