--[[ requeue_dead: move parked jobs back to due, with a fresh attempt budget.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, stats:<minute>, dead:migrating, flow:levels, flow:pdue:<p>, flow:ck:<key>, flow:ckheld:<key>, flow:held
  ARGV ids (the client picks them from the dead list: one, all, or by task / error / age)
  Returns: the number of jobs requeued. An id that is not dead is skipped, so a re-sent call
    changes nothing more. ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/flow.lua"

local prefix, wake_key = KEYS[1], KEYS[5]
local now = now_ms()
local moved = 0
for _, id in ipairs(ARGV) do
  local jk = job_key(prefix, id)
  -- pcall: an id claim parked because its key is not a hash stays parked (nothing to run).
  if redis.pcall('HGET', jk, 'state') == 'dead' and dead_unlist(prefix, id, now) > 0 then
    flow_to_due(prefix, id, now, now)
    redis.call('HSET', jk, 'state', 'due', 'attempts', 0, 'run_at_ms', fmt(now))
    redis.call('HDEL', jk, 'dead_reason', 'dead_ms')
    moved = moved + 1
  end
end
if moved > 0 then wake(wake_key) end
bump_stat(prefix, now, 'requeue_dead', moved)
return moved
