--[[ requeue_dead: move parked jobs back to due, with a fresh attempt budget (attempts 0, no
  lapses: not a suspect) and no start deadline (lib/job.lua spec_flags). A child parked by a parent (`parents` kept) waits again for those of
  its parents still pending, one requeued by the same call included (lib/flow.lua flow_rewait).
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, stats:<minute>, dead:migrating, config, flow:levels, flow:pdue:<p>, flow:ck:<key>, flow:ckheld:<key>, flow:held, flow:waiting, flow:children:<id>, moving
  ARGV ids (the client picks them from the dead list: one, all, or by task / error / age)
  Returns: the number of jobs requeued. An id that is not dead is skipped, so a re-sent call
    changes nothing more. The parents the requeued children list (each read, and linked again
    while pending) are at most LINKS_PER_CALL a call, whole children only, the first always
    taken: a call that stops before the end answers {requeued, ids handled} instead, the ids
    after those untouched, for the caller to send again.
  Errors:  CORRUPT due | leased | flow:held | flow:waiting is not a zset (nothing written: the
    key was edited by hand into another type; the flow sets only checked for a job with parents);
    BAD_ARGUMENT after=<id> (being moved to another queue): a child handled here lists a parent
    a queue move has taken (in `moving`), which it would wait for for ever (nothing written) ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/flow.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, wake_key = KEYS[1], KEYS[5]
local LINKS_PER_CALL = 1000  -- scheduler/core/limits.py REQUEUE_LINKS_PER_CALL
local now = now_ms()
-- Read every id before the first write (dead_unlist): the keys the moves write are checked
-- once, and only when a dead job needs them: due and leased for any, and the sets a child
-- waits in again (flow_rewait) for one with parents. dead_unlist's own first write, on the
-- dead key, refuses the call while nothing is written.
local dead, need_due, need_flow = {}, false, false
local links, handled = 0, #ARGV
for i, id in ipairs(ARGV) do
  -- pcall: an id claim parked because its key is not a hash stays parked (nothing to run).
  local st = redis.pcall('HMGET', job_key(prefix, id), 'state', 'parents')
  if type(st) == 'table' and not st.err and st[1] == 'dead' then
    local n, taken = flow_rewait_links(prefix, st[2])
    -- Each parent a child lists is read, and linked again while pending (flow_rewait): past
    -- the budget the call stops before this child (whole children only; the first always
    -- goes), and the caller sends the rest again.
    if links > 0 and links + n > LINKS_PER_CALL then
      handled = i - 1
      break
    end
    if taken then
      return redis.error_reply('BAD_ARGUMENT after=' .. taken .. ' (being moved to another queue)')
    end
    links = links + n
    dead[#dead + 1] = id
    need_due = true
    if st[2] then need_flow = true end
  end
end
local bad = need_due and (zset_err(prefix, 'due') or zset_err(prefix, 'leased'))
  or need_flow and (zset_err(prefix, 'flow:held') or zset_err(prefix, 'flow:waiting'))
if bad then return bad end
local moved = {}
for _, id in ipairs(dead) do
  if dead_unlist(prefix, id, now) > 0 then
    -- A fresh start: the lapse count goes with the attempts, or a requeued job that once
    -- lapsed twice (its handler since fixed) would run as a suspect, one per worker.
    local jk = job_key(prefix, id)
    redis.call('HSET', jk, 'state', 'due', 'attempts', 0, 'run_at_ms', fmt(now))
    -- A person's "run it again": its start deadline, which may be what parked it, goes too
    -- (a schedule's run: start_by_ms in its hash; an enqueued job's: in its spec flags).
    redis.call('HDEL', jk, 'dead_reason', 'dead_ms', 'lapses', 'start_by_ms', 'worker')
    spec_move_deadline(prefix, id, nil)
    moved[#moved + 1] = id
  end
end
-- Every job of the call is back (state 'due') before any is placed: a child parked by its
-- parent, requeued with it in any order, waits for it again (flow_rewait) instead of running
-- beside it.
for _, id in ipairs(moved) do
  if not flow_rewait(prefix, id, job_key(prefix, id), now) then flow_to_due(prefix, id, now, now) end
end
if #moved > 0 then wake(wake_key) end
bump_stat(prefix, now, 'requeue_dead', #moved)
if handled < #ARGV then return { #moved, handled } end
return #moved
