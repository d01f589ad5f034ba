--[[ move_out: the first step of moving waiting jobs to another queue (`scheduler queue move`,
  scheduler/admin/queue_move.py): each named job still waiting in due, never leased, and with
  no flow fields, parents, children nor schedule, leaves due for `moving` (id -> run_at_ms), where
  no worker claims it, and its whole record is returned, to be written into the other queue
  (move_in.lua) with the same id before move_done.lua deletes it here. A job already in
  `moving` (a move interrupted after this step) is returned again by 'take': a rerun re-sends it.
  Each take records its destination and server time in config (`move_to`, `move_take_ms`);
  a take or look toward another destination is refused, nothing written, while `moving` holds
  jobs (they may be in the recorded one already: a second copy would run twice) or while the
  recorded take is less than MOVE_QUIET_MS old (that run may be between two batches: the queue
  would be split). A `move_to` without a time (an older version's) counts as old.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, config, partitions, flow:held, flow:waiting, moving, move_lock
  ARGV[1] 'take' | 'fresh' (a take of ids listed from due: one found in `moving` was taken by
    another run since the listing, which sends it; answered 'taken', so that a job it wrote,
    ran there and whose record expired is not written again) | 'look' (a dry run: the same
    answer, nothing written), ARGV[2] the destination queue's name, ARGV[3] the run's lock
    token ('' = a caller holding no lock), then ids (1 .. MAX_IDS)
  The run lock (`move_lock` built from the prefix, scheduler/admin/queue_move_lock.py): a take
    ('take' | 'fresh') is refused, nothing written, unless the lock's JSON value names ARGV[3]'s
    token, or, for '', no lock is there: a run that lost its lock (paused past its lease) stops
    here, and no step-by-step caller takes while a run holds it
  Returns: one entry per id, in order: {id, 'moving', run_at_ms, spec text ('' = a hash-only
    job), {hash field, value, ...} ({} = a spec-only job)}, or {id, reason} for a job that
    stays: 'leased' | 'held' (flow control: a concurrency key, a rate, parents not done) |
    'flow' (a priority, flow keys, parents or children) | 'schedule' (a schedule's run) |
    'dead' | 'unreadable' (its record is of another type, not one this version wrote, or
    holds bytes that are not UTF-8) |
    'missing' (not waiting: finished, cancelled, gone) | 'taken' ('fresh': in `moving`)
  Errors:  BAD_ARGUMENT <field>=<value>; MOVE_LOCKED holder=<the lock's value, '' = none>
    (above; nothing written); MOVE_ELSEWHERE moving=<n> age_ms=<ms | none> to=<the
    recorded destination> (above; nothing written); MOVE_INCOMING from=<a source> (a
    'take' or 'fresh' of a job from due while config holds a `move_from:<source>` record,
    below; jobs re-sent from `moving` are not refused; nothing written); CORRUPT due | leased | moving is not a zset,
    config is not a hash (edited by hand; nothing written); the server's own refusal of the
    write (OOM, ...), nothing written ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/utf8.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, due, leased = KEYS[1], KEYS[2], KEYS[3]
local moving = prefix .. 'moving'
local cfg = prefix .. 'config'
local MAX_IDS = 1000  -- scheduler/admin/queue_move.py MOVE_PER_CALL
local MOVE_QUIET_MS = 60000  -- scheduler/admin/queue_move_check.py MOVE_QUIET_MS
local mode = table.remove(ARGV, 1)
if mode ~= 'take' and mode ~= 'fresh' and mode ~= 'look' then
  return redis.error_reply('BAD_ARGUMENT mode=' .. string.sub(tostring(mode), 1, 40))
end
local dest = table.remove(ARGV, 1)
if type(dest) ~= 'string' or #dest > 64 or not string.find(dest, '^[%w_%.%-]+$') then
  return redis.error_reply('BAD_ARGUMENT to=' .. string.sub(tostring(dest), 1, 40))
end
local token = table.remove(ARGV, 1)
if type(token) ~= 'string' or #token > 64 then
  return redis.error_reply('BAD_ARGUMENT token=' .. string.sub(tostring(token), 1, 40))
end
if #ARGV < 1 or #ARGV > MAX_IDS then return redis.error_reply('BAD_ARGUMENT n=' .. #ARGV) end
for _, id in ipairs(ARGV) do
  if not job_id_ok(id) then return redis.error_reply('BAD_ARGUMENT id=' .. string.sub(id, 1, 40)) end
end
-- A partitioned queue's name holds no jobs: its partitions are moved one by one.
local err = partitioned_err(prefix)
if err then return err end
err = zset_err(prefix, 'due') or zset_err(prefix, 'leased') or zset_err(prefix, 'moving')
  or key_type_err(cfg, 'config', 'hash')
if err then return err end

-- One run at a time (the run lock, the header): checked here, atomically with the take.
if mode ~= 'look' then
  local locked = move_lock_err(prefix, token)
  if locked then return locked end
end

-- One destination at a time (the header): decided here, atomically with the take.
local now = now_ms()
local rec = redis.call('HMGET', cfg, 'move_to', 'move_take_ms')
if rec[1] and rec[1] ~= dest then
  local busy = redis.call('ZCARD', moving)
  local took = parse_int(rec[2], 0, now + MOVE_QUIET_MS)  -- far ahead (a hand edit): old
  local age = took and math.max(now - took, 0)
  if busy > 0 or (age and age < MOVE_QUIET_MS) then
    return redis.error_reply('MOVE_ELSEWHERE moving=' .. busy .. ' age_ms=' .. (age or 'none')
      .. ' to=' .. string.sub(rec[1], 1, 80))
  end
end

-- Fields that tie a job to others or to flow control: such a job stays (its holds and links
-- live in this queue's keys).
local TIED = { 'priority', 'ckey', 'rkey', 'parents', 'kids', 'schedule' }
local function stay_reason(id)
  if redis.call('ZSCORE', leased, id) then return 'leased' end
  if type(redis.pcall('ZSCORE', prefix .. 'flow:held', id)) == 'string'
      or type(redis.pcall('ZSCORE', prefix .. 'flow:waiting', id)) == 'string' then
    return 'held'
  end
  if type(redis.pcall('ZSCORE', KEYS[4], id)) == 'string' then return 'dead' end
  return 'missing'
end

local out, adds = {}, {}
for _, id in ipairs(ARGV) do
  local jk, sk = job_key(prefix, id), spec_key(prefix, id)
  local at = redis.call('ZSCORE', moving, id)
  local again = at ~= false
  if not at then at = redis.call('ZSCORE', due, id) end
  if again and mode == 'fresh' then
    out[#out + 1] = { id, 'taken' }
  elseif not at then
    out[#out + 1] = { id, stay_reason(id) }
  else
    local spec = redis.pcall('GET', sk)
    local fields = redis.pcall('HGETALL', jk)
    local reason = nil
    if type(spec) == 'table' or type(fields) == 'table' and fields.err then
      reason = 'unreadable'
    elseif not parse_int(at, 0, LIM.time_ms) then
      reason = 'unreadable'  -- a score edited into no whole ms: move_in would refuse its batch
    elseif spec and not read_spec(spec, at) then
      reason = 'unreadable'
    elseif not spec and #fields == 0 then
      reason = 'unreadable'  -- in due with no record: doctor's case
    else
      local h, text = {}, not spec or is_utf8(spec)
      for i = 1, #fields, 2 do h[fields[i]] = true end
      -- Bytes a decoding client cannot read (a hand edit) would reach the destination as
      -- other text: such a job stays, where its claim parks it.
      for i = 1, #fields do text = text and is_utf8(fields[i]) end
      if not text then reason = 'unreadable' end
      for _, f in ipairs(TIED) do
        if h[f] then reason = (f == 'schedule') and 'schedule' or 'flow' end
      end
    end
    if reason then  -- one found in moving this way (edited since) stays there: doctor's case
      out[#out + 1] = { id, reason }
    else
      out[#out + 1] = { id, 'moving', at, spec or '', fields }
      if not again then
        adds[#adds + 1] = at
        adds[#adds + 1] = id
      end
    end
  end
end
-- A move into this queue that may still hold copies here (`move_from:<source>` in config:
-- written by that run before each put, deleted at its end; scheduler/admin/queue_move_check.py):
-- moved on from here now, its rerun writes them here again, and they run twice. Checked at
-- each take of a job from due, atomically with it (a run's check at its start may come before
-- that run's first put). A rerun's own jobs in `moving` are re-sent all the same: each was
-- taken from due under this check, so none is a copy, and sent they let that move finish too
-- (refused, two stopped moves each waited on the other). A record left behind is deleted by
-- the next run's check; a dry run ('look') reads on.
if mode ~= 'look' and #adds > 0 then  -- HGETALL: in both ACL roles (docs/security.md)
  local all = redis.call('HGETALL', cfg)
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 10) == 'move_from:' then
      return redis.error_reply('MOVE_INCOMING from=' .. string.sub(all[i], 11, 90))
    end
  end
end
if mode ~= 'look' then
  local r = write_refused(redis.pcall('HSET', cfg, 'move_to', dest, 'move_take_ms', now),
    'config', 'hash')
  if r then return r end
end
if #adds > 0 and mode ~= 'look' then
  for i = 2, #adds, 2 do redis.call('ZREM', due, adds[i]) end
  call_chunked('ZADD', moving, adds)
end
return out
