--[[ schedule_refill: top up a cron schedule's slot buffer; when the schedule starved (its
  buffer ran out before the next slot could be inserted), insert that occurrence now under the
  misfire budget recorded then. Idempotent: slots are a set, and the occurrence id is
  deterministic, so many clients refilling at once change nothing more than one.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, stats:<minute>, schedule:<name>, schedules:refill, config, flow:levels, flow:pdue:<p>
  ARGV[1] name  ARGV[2] digest the client computed the slots for ('' when it could not read
    the schedule's keys)
  ARGV[3..] slots (ms, ascending) after the schedule's cursor; none when there are no more
    (past the last time the scripts store, 2200) or the client cannot compute them (a
    hand-edited cron or tz): the request is dropped and nothing is placed
  Returns: {status, pending id or ''}: 'refilled' | 'stale' (removed or redefined meanwhile:
    nothing to do) | 'paused' | 'unreadable' (the hash cannot be read whole or has no digest,
    or the slots key is of another type: left for an operator). The name leaves
    schedules:refill in every case but a digest that differs from ARGV[2] (the next claim's
    client reads the new definition) and the CORRUPT error below, so a schedule no client can
    refill does not make every claim ask again.
  Errors:  BAD_ARGUMENT <field>=<value>; CORRUPT due is not a zset (edited by hand into
    another type, when a starved schedule's occurrence is to be placed): nothing written ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/rearm.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, name, digest = KEYS[1], ARGV[1], ARGV[2]
local slots, err = int_args(3, 'slot', 0, LIM.time_ms)
if err then return err end
local refill = sched_refill_key(prefix)
local h = sched_load(prefix, name)
local sk = sched_key(prefix, name)
if h == nil or h.kind ~= 'cron' then
  redis.pcall('SREM', refill, name)
  if h == nil and redis.call('EXISTS', sk) == 1 then return { 'unreadable', '' } end
  return { 'stale', '' }
end
local slots_key = sched_slots_key(prefix, name)
local stored = redis.call('HGET', sk, 'digest')
-- ZCARD, not TYPE (outside the app role's ACL, docs/security.md): an error is another type.
if not stored or stored == '' or type(redis.pcall('ZCARD', slots_key)) ~= 'number' then
  redis.pcall('SREM', refill, name)
  return { 'unreadable', '' }
end
if stored ~= digest then return { 'stale', '' } end
-- No slots: nothing more can be placed (a starved schedule stays so until redefined).
local place = h.paused ~= '1' and #slots > 0 and redis.call('HGET', sk, 'starved') == '1'
-- due takes that occurrence (lib/rearm.lua sched_insert, after the writes below).
local bad = place and zset_err(prefix, 'due')
if bad then return bad end
for _, v in ipairs(slots) do
  if v > h.cursor_ms then redis.call('ZADD', slots_key, v, fmt(v)) end
end
redis.pcall('SREM', refill, name)
if h.paused == '1' then return { 'paused', '' } end
if place then
  local now = now_ms()
  local budget = parse_int(redis.call('HGET', sk, 'budget'), 0, LIM.attempts) or 0
  -- The placing its claim or end could not make (the buffer had run out): that re-arm.
  if sched_place(prefix, h, h.cursor_ms, budget, now) then bump_stat(prefix, now, 'rearm', 1) end
end
return { 'refilled', h.pending }
