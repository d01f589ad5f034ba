--[[ counts: how many jobs are in each place, by server time (read only, but for one bounded
  step of converting an old dead LIST, lib/job.lua).
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, dead:migrating, config, flow:rheld, flow:held, flow:waiting, moving
  Returns: {now_ms, due_now (with the flow:held ones), scheduled_later, leased, dead, oldest_due_run_at_ms or -1,
    leases_lapsed, held_by_key_limit, held_by_rate_window, held_waiting_for_parents,
    paused_ms (queue_pause.lua; 0 when the stored value is not a time, -1 when not paused),
    moving (waiting jobs a queue move took out of due: scheduler/admin/queue_move.py)}
  Errors:  NEWER_STORAGE (lib/util.lua newer_storage_err: a newer version stores the queue) ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"

-- Refused as every script that writes: it may convert a step of a dead LIST, and a newer
-- layout's keys would be misread (or a newer `dead` LIST converted) instead of named.
local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, due, leased = KEYS[1], KEYS[2], KEYS[3]
local now = now_ms()
-- Jobs set aside by flow control (lib/flow.lua) are due too, only not in the due set.
local in_due = redis.call('ZCOUNT', due, '-inf', now)
-- An advisory flow set edited into another type counts as empty (doctor reports the key): the
-- counts, and every listing and status that reads the clock from them, stay readable.
local function card(key)
  local n = redis.pcall('ZCARD', key)
  return type(n) == 'number' and n or 0
end
local held = card(prefix .. 'flow:held')
local rheld = card(prefix .. 'flow:rheld')
local waiting = card(prefix .. 'flow:waiting')
-- Taken out of due by `scheduler queue move` (move_out.lua): in no other count until it ends.
local moving = card(prefix .. 'moving')
local due_now = in_due + held
local total = redis.call('ZCARD', due)
local head = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')
-- Clamped: a hand-written score (inf) must not reach the reply as text a client cannot parse.
local oldest = head[2] and math.max(math.min(math.floor(tonumber(head[2])), LIM.time_ms), 0) or -1
-- As claim reads it: a config of another type is no pause.
local p = redis.pcall('HGET', prefix .. 'config', 'paused_ms')
local paused_ms = -1
if type(p) == 'string' then paused_ms = parse_int(p, 0, LIM.time_ms) or 0 end
return { fmt(now), due_now, total - in_due, redis.call('ZCARD', leased), dead_size(prefix, now),
  fmt(oldest), redis.call('ZCOUNT', leased, '-inf', now), math.max(held - rheld - waiting, 0), rheld,
  waiting, fmt(paused_ms), moving }
