--[[ release: give claimed jobs back without spending their attempt (graceful shutdown).
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, stats:<minute>, config, flow:levels, flow:pdue:<p>, flow:ck:<key>, flow:ckheld:<key>, flow:held
  ARGV pairs: id, token
  Returns: one status per job: 'released' | 'stale' | 'cancelled' | 'missing'. The job is due
    again at once, with its attempt count given back. A re-sent call answers 'released' again.
  Errors:  BAD_ARGUMENT argc=<n>; CORRUPT due is not a zset (nothing written: the key was
    edited by hand into another type) ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/lease.lua"
-- @include "lib/flow.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, wake_key = KEYS[1], KEYS[5]
if #ARGV % 2 ~= 0 then return redis.error_reply('BAD_ARGUMENT argc=' .. #ARGV) end
local now = now_ms()
local out, released = {}, 0
-- lease_check's fields, then the attempt count: one HMGET of the job.
local READ = { 'token', 'state', 'settled_token', 'settled', 'settled_log', 'attempts' }
for i = 1, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local status, outcome, f = lease_check(prefix, id, token, READ)
  if status == 'settled' then
    status = (outcome == 'released') and 'released' or 'stale'
  elseif status == 'held' then
    -- The call's first write is the first held job's: due checked once before it, so no later
    -- job's ZADD can fail after the earlier jobs' writes (leased needs no check: its ZREM comes
    -- first, and an error there has written nothing).
    if released == 0 then
      local bad = zset_err(prefix, 'due')
      if bad then return bad end
    end
    local jk = job_key(prefix, id)
    local attempts = parse_int(f[6], 0, LIM.attempts) or 1
    flow_to_due(prefix, id, now, now)
    redis.call('HSET', jk, 'state', 'due', 'attempts', fmt(math.max(attempts - 1, 0)))
    redis.call('HDEL', jk, 'worker')
    settle(jk, token, 'released')
    status = 'released'
    released = released + 1
  end
  out[#out + 1] = status
end
if released > 0 then wake(wake_key) end
bump_stat(prefix, now, 'release', released)
return out
