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
    hand-edited cron): the request is dropped and nothing is placed. ARGV[3] 'later' (alone):
    the client's host could not load the zone (an older tz database, EMFILE), which says
    nothing of the definition: the request stays for the next claim, any worker's, counted
    per definition (refill_for: its digest, refill_tries, refill_from_ms; a refill with slots
    clears them) and dropped once SCHED_REFILL_TRIES such answers and SCHED_REFILL_KEEP_MS
    have passed ('failed': doctor reports the schedule starved, the same definition sent
    again refills it)
  Returns: {status, pending id or ''}: 'refilled' | 'later' | 'failed' | 'stale' (removed or
    redefined meanwhile: nothing to do) | 'paused' | 'unreadable' (the hash cannot be read
    whole or has no digest, or the slots key is of another type: left for an operator). The
    name leaves schedules:refill in every case but a digest that differs from ARGV[2] (the
    next claim's client reads the new definition), 'later' and the CORRUPT error below, so a
    schedule no client can refill does not make every claim ask again.
  Errors:  BAD_ARGUMENT <field>=<value>; CORRUPT due is not a zset (edited by hand into
    another type, when a starved schedule's occurrence is to be placed): nothing written ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/rearm.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

-- A refill no client could compute stays asked for this many answers and this long (10 min).
local SCHED_REFILL_TRIES = 50
local SCHED_REFILL_KEEP_MS = 600000

local prefix, name, digest = KEYS[1], ARGV[1], ARGV[2]
local later = ARGV[3] == 'later' and #ARGV == 3
local slots, err = {}, nil
if not later then slots, err = int_args(3, 'slot', 0, LIM.time_ms) end
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
if later and h.paused ~= '1' then
  -- Per definition, not per cursor: runs still claimed move the cursor, and each asks again
  -- while the buffer is low. A hand edit of the count reads as spent, of the time as long ago.
  local now = now_ms()
  local t = redis.call('HMGET', sk, 'refill_for', 'refill_tries', 'refill_from_ms')
  local k, from = 0, now
  if t[1] == digest then
    k = parse_int(t[2], 0, SCHED_REFILL_TRIES) or SCHED_REFILL_TRIES
    from = math.min(parse_int(t[3], 0, LIM.time_ms) or 0, now)
  end
  if k < SCHED_REFILL_TRIES or now - from < SCHED_REFILL_KEEP_MS then
    redis.call('HSET', sk, 'refill_for', digest, 'refill_tries',
      fmt(math.min(k + 1, SCHED_REFILL_TRIES)), 'refill_from_ms', fmt(from))
    return { 'later', h.pending }
  end
  redis.pcall('SREM', refill, name)
  return { 'failed', h.pending }
end
-- No slots: nothing more can be placed (a starved schedule stays so until redefined).
local place = h.paused ~= '1' and #slots > 0 and redis.call('HGET', sk, 'starved') == '1'
-- due takes that occurrence (lib/rearm.lua sched_insert, after the writes below).
local bad = place and zset_err(prefix, 'due')
if bad then return bad end
for _, v in ipairs(slots) do
  if v > h.cursor_ms then redis.call('ZADD', slots_key, v, fmt(v)) end
end
if #slots > 0 then redis.call('HDEL', sk, 'refill_for', 'refill_tries', 'refill_from_ms') end
redis.pcall('SREM', refill, name)
if h.paused == '1' then return { 'paused', '' } end
if place then
  local now = now_ms()
  local budget = parse_int(redis.call('HGET', sk, 'budget'), 0, LIM.attempts) or 0
  -- The placing its claim or end could not make (the buffer had run out): that re-arm.
  if sched_place(prefix, h, h.cursor_ms, budget, now) then bump_stat(prefix, now, 'rearm', 1) end
end
return { 'refilled', h.pending }
