--[[ release: give claimed jobs back without spending their attempt (graceful shutdown).
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, stats:<minute>, flow:levels, flow:pdue:<p>, flow:ck:<key>, flow:ckheld:<key>, flow:held
  ARGV pairs: id, token
  Returns: one status per job: 'released' | 'stale' | 'cancelled' | 'missing'. The job is due
    again at once, with its attempt count given back. A re-sent call answers 'released' again.
  Errors:  BAD_ARGUMENT argc=<n> ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/lease.lua"
-- @include "lib/flow.lua"

local prefix, wake_key = KEYS[1], KEYS[5]
if #ARGV % 2 ~= 0 then return redis.error_reply('BAD_ARGUMENT argc=' .. #ARGV) end
local now = now_ms()
local out, released = {}, 0
for i = 1, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local status, outcome = lease_check(prefix, id, token)
  if status == 'settled' then
    status = (outcome == 'released') and 'released' or 'stale'
  elseif status == 'held' then
    local jk = job_key(prefix, id)
    local attempts = parse_int(redis.call('HGET', jk, 'attempts'), 0, LIM.attempts) or 1
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
