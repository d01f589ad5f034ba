--[[ schedule_pause: stop a schedule; its pending occurrence (not yet claimed) is withdrawn.
  A run already leased finishes normally. A schedule hash that cannot be read whole
  (hand-edited) is paused too (lib/schedule.lua sched_husk).
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, stats:<minute>, schedule:<name>, schedules:refill, dead:migrating, config, result:<id>, result_wait:<id>, flow:levels, flow:pdue:<p>, flow:ck:<key>, flow:ckheld:<key>, flow:rheld, flow:held, flow:waiting, flow:children:<id>, flow:ending, flow:ending:<word>:<id>
  ARGV[1] name
  Returns: 'paused' | 'already' (was paused: nothing written) | 'missing' | 'unreadable' (the
    schedule key is of another type, by hand: nothing written; remove clears it)
  Errors:  CORRUPT <key> is not a <type> (due, leased for a pending occurrence with a
    concurrency key, or dead or leased for one with waiting children: its withdrawal parks them, as a
    cancel does; edited by hand into another type: lib/rearm.lua sched_unpend); nothing
    written ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/rearm.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, name = KEYS[1], ARGV[1]
local h = sched_load(prefix, name) or sched_husk(prefix, name)
if h == nil then
  return redis.call('EXISTS', sched_key(prefix, name)) == 1 and 'unreadable' or 'missing'
end
if h.paused == '1' then return 'already' end
local bad = sched_unpend(prefix, h, now_ms())
if bad then return bad end
redis.call('HSET', sched_key(prefix, name), 'paused', '1', 'starved', '0')
redis.pcall('SREM', sched_refill_key(prefix), name)
return 'paused'
