--[[ purge_dead: delete parked jobs for good.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, schedule:<name>, schedules:refill, dead:migrating, flow:levels, flow:pdue:<p>
  ARGV ids (picked by the client from the dead list)
  Returns: the number of dead ids removed. An id whose job is not dead (or not in the dead list)
    is skipped. An id whose key is not a hash (claim parked it by its id alone), or whose keys
    are gone (deleted by hand), only leaves the dead list: it counts, and nothing else is
    deleted. Purging a schedule's pending occurrence (parked by hand, e.g. by doctor) arms the
    schedule's next one. ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/rearm.lua"

local prefix = KEYS[1]
local purged = 0
local now = now_ms()
for _, id in ipairs(ARGV) do
  local jk = job_key(prefix, id)
  -- pcall: claim parks a key that is not a hash by its id alone; purging drops the id only.
  -- So for an id with neither hash nor spec left: no job to delete, its entry goes.
  local state = redis.pcall('HGET', jk, 'state')
  if (type(state) == 'table' and state.err) or (not state and not job_exists(prefix, id)) then
    if dead_unlist(prefix, id, now) > 0 then purged = purged + 1 end
  elseif state == 'dead' and dead_unlist(prefix, id, now) > 0 then
    local schedule = redis.call('HGET', jk, 'schedule')
    job_del(prefix, id)
    if schedule_name_ok(schedule) then
      sched_ended(prefix, schedule, id, now)
    end
    purged = purged + 1
  end
end
return purged
