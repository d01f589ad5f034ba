--[[ schedule_resume: restart a paused schedule at its first slot after now (the slots that
  passed while paused were not missed: they do not count for the misfire policy), and after
  the last slot that left due (ran_ms, lib/rearm.lua).
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, schedule:<name>, schedules:refill, config, flow:levels, flow:pdue:<p>
  ARGV[1] name  ARGV[2] digest the client computed the slots for
  ARGV[3..] cron only: the next slots (ms, ascending) after now - offset_ms
  Returns: {status, pending id or ''}: 'resumed' | 'active' (was not paused: nothing written) |
    'stale' (the definition changed under the client, or it was paused after the client read
    it active: a cron one came without slots; nothing written, retry) | 'missing' |
    'unreadable' (a hash lib/schedule.lua sched_load cannot read whole, or without a digest:
    nothing written)
  Errors:  BAD_ARGUMENT slot=<value>; CORRUPT due is not a zset (edited by hand into
    another type: the first occurrence cannot be placed); nothing written ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/rearm.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, name, digest = KEYS[1], ARGV[1], ARGV[2]
local slots, err = int_args(3, 'slot', 0, LIM.time_ms)
if err then return err end
local h = sched_load(prefix, name)
if h == nil then
  if sched_husk(prefix, name) then return { 'unreadable', '' } end
  return { 'missing', '' }
end
if h.paused ~= '1' then return { 'active', h.pending } end
local sk = sched_key(prefix, name)
local stored = redis.call('HGET', sk, 'digest')
if not stored or stored == '' then return { 'unreadable', '' } end  -- no client can match it
if stored ~= digest then return { 'stale', '' } end
-- A cron schedule sent no slots: the client read it active (no slots needed), and it was paused
-- since. The definition changed under the client: it reads it again.
if h.kind == 'cron' and #slots == 0 then return { 'stale', '' } end
-- due takes the first occurrence (lib/rearm.lua sched_insert, after the writes below).
local bad = zset_err(prefix, 'due')
if bad then return bad end
local now = now_ms()
local slots_key = sched_slots_key(prefix, name)
redis.call('DEL', slots_key)
for _, v in ipairs(slots) do redis.call('ZADD', slots_key, v, fmt(v)) end
redis.call('HSET', sk, 'paused', '0', 'pending', '', 'starved', '0')
h.paused, h.pending = '0', ''
sched_place(prefix, h, sched_from(h, now), 0, now)
return { 'resumed', h.pending }
