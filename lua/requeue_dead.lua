--[[ requeue_dead: move parked jobs back to due, with a fresh attempt budget (attempts 0, no
  lapses: not a suspect).
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, stats:<minute>, dead:migrating, flow:levels, flow:pdue:<p>, flow:ck:<key>, flow:ckheld:<key>, flow:held
  ARGV ids (the client picks them from the dead list: one, all, or by task / error / age)
  Returns: the number of jobs requeued. An id that is not dead is skipped, so a re-sent call
    changes nothing more.
  Errors:  CORRUPT due | leased is not a zset (nothing written: the key was edited by hand into
    another type) ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/flow.lua"

local prefix, wake_key = KEYS[1], KEYS[5]
local now = now_ms()
local moved, checked = 0, false
for _, id in ipairs(ARGV) do
  local jk = job_key(prefix, id)
  -- pcall: an id claim parked because its key is not a hash stays parked (nothing to run).
  local dead = redis.pcall('HGET', jk, 'state') == 'dead'
  -- The call's first write is the first dead job's (dead_unlist): due and leased, which its
  -- move writes after that, checked once before it (dead_unlist's own first write, on the dead
  -- key, refuses the call while nothing is written).
  if dead and not checked then
    local bad = zset_err(prefix, 'due') or zset_err(prefix, 'leased')
    if bad then return bad end
    checked = true
  end
  if dead and dead_unlist(prefix, id, now) > 0 then
    flow_to_due(prefix, id, now, now)
    redis.call('HSET', jk, 'state', 'due', 'attempts', 0, 'run_at_ms', fmt(now))
    -- A fresh start: the lapse count goes with the attempts, or a requeued job that once
    -- lapsed twice (its handler since fixed) would run as a suspect, one per worker.
    redis.call('HDEL', jk, 'dead_reason', 'dead_ms', 'lapses')
    moved = moved + 1
  end
end
if moved > 0 then wake(wake_key) end
bump_stat(prefix, now, 'requeue_dead', moved)
return moved
