--[[ schedule_remove: delete a schedule and its pending occurrence (not yet claimed). A run
  already leased finishes normally and inserts nothing. A schedule hash that cannot be read
  whole (hand-edited) is removed too (lib/schedule.lua sched_husk), and so is a key of another
  type; with no hash, a name left in the schedules index is dropped from it ('removed': the name the list showed is gone; 'missing' when
  nothing of it was there).
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, stats:<minute>, schedule:<name>, schedules:refill, schedule_ran:<name>, schedules, dead:migrating, config, result:<id>, result_wait:<id>, flow:levels, flow:pdue:<p>, flow:ck:<key>, flow:ckheld:<key>, flow:rheld, flow:held, flow:waiting, flow:children:<id>, flow:ending, flow:ending:<word>:<id>
  ARGV[1] name
  Returns: 'removed' | 'missing'
  Errors:  CORRUPT <key> is not a <type> (due, leased for a pending occurrence with a
    concurrency key, or dead or leased for one with waiting children: its withdrawal parks them, as a
    cancel does; edited by hand into another type: lib/rearm.lua sched_unpend); nothing
    written. The schedules index is advisory: one of another type is left as it is. ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/rearm.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, name = KEYS[1], ARGV[1]
local h = sched_load(prefix, name) or sched_husk(prefix, name)
if h == nil then
  -- No hash: a key of another type (by hand; doctor's remedy is this remove, then add) is
  -- deleted with its buffer; a name left in the index without its hash (deleted by hand) is
  -- dropped from it, so `queue move` does not count it. pcall: the index may be of another type.
  local sk = sched_key(prefix, name)
  local other = redis.call('EXISTS', sk) == 1
  redis.call('DEL', sk, sched_slots_key(prefix, name))
  local listed = redis.pcall('SREM', prefix .. 'schedules', name)
  redis.pcall('SREM', sched_refill_key(prefix), name)
  return (other or listed == 1) and 'removed' or 'missing'
end
local bad = sched_unpend(prefix, h, now_ms())
if bad then return bad end
-- The last slot that left due outlives the schedule for a while (schedule_ran:<name>): defined
-- again, with a jitter that moves a slot later, it would place a slot that already ran.
if (tonumber(h.ran_ms) or 0) > 0 then
  redis.call('SET', prefix .. 'schedule_ran:' .. name, fmt(h.ran_ms), 'PX', SCHED_RAN_KEEP_MS)
end
redis.call('DEL', sched_key(prefix, name), sched_slots_key(prefix, name))
-- pcall: the schedules SET is an index for listing alone (schedule_upsert.lua); one of another
-- type must not fail a removal after its first write.
redis.pcall('SREM', prefix .. 'schedules', name)
redis.pcall('SREM', sched_refill_key(prefix), name)
return 'removed'
