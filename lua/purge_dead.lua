--[[ purge_dead: delete parked jobs for good.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, stats:<minute>, schedule:<name>, schedules:refill, dead:migrating, config, flow:levels, flow:pdue:<p>
  ARGV ids (picked by the client from the dead list)
  Returns: the number of dead ids removed. An id whose job is not dead (or not in the dead list)
    is skipped. An id whose key is not a hash (claim parked it by its id alone), or whose keys
    are gone (deleted by hand), only leaves the dead list: it counts, and nothing else is
    deleted. Purging a schedule's pending occurrence (parked by hand, e.g. by doctor) arms the
    schedule's next one.
  Errors:  CORRUPT due is not a zset (only when an id is a schedule's dead occurrence; nothing
    written: the key was edited by hand into another type) ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/rearm.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix = KEYS[1]
local purged = 0
local now = now_ms()
-- Each id's state and schedule, read before the first write. pcall: claim parks a key that is
-- not a hash by its id alone; purging drops the id only.
local reads, occurrence = {}, false
for i, id in ipairs(ARGV) do
  local v = redis.pcall('HMGET', job_key(prefix, id), 'state', 'schedule')
  reads[i] = v
  if not v.err and v[1] == 'dead' and schedule_name_ok(v[2]) then occurrence = true end
end
-- Purging an occurrence may arm its schedule's next one (sched_ended), a write into due after
-- this call's first writes: due checked before them.
if occurrence then
  local bad = zset_err(prefix, 'due')
  if bad then return bad end
end
for i, id in ipairs(ARGV) do
  local v = reads[i]
  -- An id with neither hash nor spec left: no job to delete, its entry goes.
  if v.err or (not v[1] and not job_exists(prefix, id)) then
    if dead_unlist(prefix, id, now) > 0 then purged = purged + 1 end
  elseif v[1] == 'dead' and dead_unlist(prefix, id, now) > 0 then
    job_del(prefix, id)
    if schedule_name_ok(v[2]) then
      sched_ended(prefix, v[2], id, now)
    end
    purged = purged + 1
  end
end
return purged
