-- Job keys and job-level moves shared by several transitions: the only place a script formats
-- a job key (tests/test_lua_layout.py checks it). Membership in due / leased / dead is the
-- truth; the hash's `state` field is a copy written by the same script.
-- @include "lib/util.lua"

local function job_key(prefix, id)
  return prefix .. 'job:' .. id
end

-- A job enqueued by this version is, until its first claim, one STRING `spec:<id>` (its
-- immutable spec) and an entry in due: no hash. The record, fields separated by '|':
--   2|task|max_attempts|backoff|timeout_ms|enqueued_ms|result_ttl_ms|flags|payload
-- '2' is the layout version; an empty field is its default: max_attempts 5, backoff
-- SPEC_BACKOFF, timeout_ms 0, enqueued_ms = run_at_ms (the due score), result_ttl_ms = the
-- completing worker's, flags '' (else 'k' = keep the payload once done, then 'd' and the ms
-- of its start deadline: no attempt starts after it, claim parks the job instead; 'd' is new
-- in this version: an older claim reads the flags as not 'k': it ignores the deadline and drops
-- a kept payload; docs/guide/workers.md, Upgrading). The payload (JSON) comes last, so it may
-- hold '|'. run_at_ms is the due score, the state is which set holds the id.
-- At first claim the hash `job:<id>` is born with the mutable state and the few spec fields a
-- finished job keeps or that change (task, run_at_ms, enqueued_ms; max_attempts when not 5,
-- result_ttl_ms and keep_payload when set); payload, backoff, timeout_ms (and the default
-- max_attempts) are read from the spec, which
-- lives until the job is done (readers merge both: claim's read_claimable, models.with_spec);
-- jobs written as one hash (older versions, schedule occurrences) have no spec at all.
local SPEC_BACKOFF = '1000,2.0,3600000,0.25'  -- scheduler/core/limits.py DEFAULT_BACKOFF
local function spec_key(prefix, id)
  return prefix .. 'spec:' .. id
end

-- One call's jobs share their enqueued_ms (the server's now): its text is made once per call.
local packed_enq_ms = nil
local packed_enq_s = nil
local function pack_spec(task, max_attempts, backoff, timeout_ms, enqueued_ms, run_at_ms,
                         result_ttl_ms, flags, payload)
  local enq = ''
  if enqueued_ms ~= run_at_ms then
    if enqueued_ms ~= packed_enq_ms then packed_enq_ms, packed_enq_s = enqueued_ms, fmt(enqueued_ms) end
    enq = packed_enq_s
  end
  return table.concat({ '2', task, max_attempts == 5 and '' or fmt(max_attempts),
    backoff == SPEC_BACKOFF and '' or backoff, timeout_ms == 0 and '' or fmt(timeout_ms),
    enq, result_ttl_ms, flags, payload }, '|')
end

-- The spec's fields as the hash would hold them (strings), or nil and the field that is bad.
-- Only the layout is read here; claim checks every value it hands out.
local SPEC_RE = '^2|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$'
local function read_spec(text, run_at_s)
  if type(text) ~= 'string' then return nil, 'record' end
  local task, ma, bo, to, enq, ttl, flags, payload = string.match(text, SPEC_RE)
  if task == nil then return nil, 'record' end
  return { task = task, max_attempts = ma ~= '' and ma or '5',
    backoff = bo ~= '' and bo or SPEC_BACKOFF, timeout_ms = to ~= '' and to or '0',
    enqueued_ms = enq ~= '' and enq or run_at_s, result_ttl_ms = ttl, flags = flags,
    payload = payload }
end

-- The spec of `id`: its fields, false when there is none (a hash-only job), or nil and a
-- reason when it cannot be read (a key of another type, a record edited by hand).
-- `head`: only the fields before the payload are wanted (no `payload` in the table), read from
-- the record's first 1,024 bytes (GETRANGE; lua/dead_match.lua reads the task so): a GET
-- copied a 512 KiB payload into the script to read a few bytes (a requeue of 500 such dead
-- jobs held the server 798 ms). The whole record is read only when its head is not there (a
-- field edited by hand to be long, no record, a key of another type: the same answers).
local function job_spec(prefix, id, run_at_s, head)
  if head then
    -- The bounds as text: a Lua number argument is formatted (%.17g) at each call.
    local text = redis.pcall('GETRANGE', spec_key(prefix, id), '0', '1023')
    -- A record shorter than the head is whole (one match, as a GET's: fail's small jobs).
    local fields = type(text) == 'string' and text ~= '' and (#text < 1024 and text
      or string.match(text, '^2|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|'))
    local sp = fields and read_spec(fields, run_at_s)
    if sp then
      sp.payload = nil
      return sp
    end
  end
  local text = redis.pcall('GET', spec_key(prefix, id))
  if type(text) == 'table' then return nil, 'record' end
  if not text then return false end
  return read_spec(text, run_at_s)
end

-- Before a pending job's due score moves (reschedule): a spec record that leaves enqueued_ms
-- out reads it as that score, so write the current one in. A record that cannot be read is
-- left as it is (claim parks it). Its head is read first (GETRANGE, as job_spec's): a record
-- that fits in it is whole, a longer one is read whole only to be written back (a parent's
-- park pins each waiting child: a GET copied each 512 KiB payload to find it pinned).
local function spec_pin_enqueued(prefix, id, run_at_s)
  local sk = spec_key(prefix, id)
  local text = redis.pcall('GETRANGE', sk, '0', '1023')
  if type(text) ~= 'string' then return end
  if #text == 1024 then
    local enq = string.match(text, '^2|[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)|')
    if enq and enq ~= '' then return end
    text = redis.pcall('GET', sk)
    if type(text) ~= 'string' then return end
  end
  local head, enq, tail = string.match(text, '^(2|[^|]*|[^|]*|[^|]*|[^|]*|)([^|]*)(|.*)$')
  if head and enq == '' then redis.call('SET', sk, head .. run_at_s .. tail, 'KEEPTTL') end
end

-- A job never claimed that leaves its place for good (parked, cancelled): its spec's
-- enqueued_ms '' reads as its due score, which it no longer has, and its run time was that
-- score alone. Both are written down (its hash holds run_at_ms, as a claimed job's does), so
-- `jobs show` and a requeue's first claim keep them. A key of another type is left alone.
local function pin_unclaimed(prefix, id, jk, run_at_s)
  spec_pin_enqueued(prefix, id, run_at_s)
  if redis.pcall('HEXISTS', jk, 'run_at_ms') == 0 then redis.call('HSET', jk, 'run_at_ms', run_at_s) end
end

-- The flags field, '^(k?)(d<digits>)?$' (scheduler/core/spec_record.py reads the same): keep
-- the payload ('k'), and the start deadline in ms (nil: none; one beyond LIM.time_ms is none).
-- Any other text (a hand edit) is neither, for both readers.
local function spec_flags(flags)
  local keep, deadline = string.match(flags, '^(k?)d(%d+)$')
  if keep == nil then return flags == 'k', nil end
  return keep == 'k', parse_int(deadline, 0, LIM.time_ms)
end

-- A cancelled job's spec record without its payload: nothing runs or requeues a cancelled job,
-- and a done one drops its payload too (complete.lua deletes its record). The fields before it
-- stay: status, get_job and the retention (result_ttl_ms, doctor) read them. Read from the
-- record's head (GETRANGE): a payload the job keeps (flags 'k') stays, and so does a record
-- whose head is not there (none, edited by hand, a key of another type).
local function spec_drop_payload(prefix, id)
  local sk = spec_key(prefix, id)
  local text = redis.pcall('GETRANGE', sk, '0', '1023')
  if type(text) ~= 'string' then return end
  local head, flags = string.match(text, '^(2|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)|)')
  if head and not spec_flags(flags) then redis.call('SET', sk, head, 'KEEPTTL') end
end

-- A pending job's spec record with its start deadline changed: shifted by `delta_ms` (a
-- reschedule moves the deadline with the run time, so the job keeps its window), or dropped
-- (delta_ms nil: a requeue from dead, whose deadline is what parked it). A record without one,
-- or one that cannot be read, is left as it is.
local SPEC_FLAGS_RE = '^(2|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|)(k?)d(%d+)(|.*)$'
local function spec_move_deadline(prefix, id, delta_ms)
  -- The flags come before the payload: the record's head says whether there is a deadline,
  -- and the whole record is read (to be written back) only then.
  local sp = job_spec(prefix, id, '0', true)
  if not (sp and select(2, spec_flags(sp.flags))) then return end
  local sk = spec_key(prefix, id)
  local text = redis.pcall('GET', sk)
  if type(text) ~= 'string' then return end
  local head, keep, deadline, tail = string.match(text, SPEC_FLAGS_RE)
  local ms = deadline and parse_int(deadline, 0, LIM.time_ms)
  if not ms then return end
  local flags = keep
  if delta_ms then
    flags = keep .. 'd' .. fmt(math.max(0, math.min(ms + delta_ms, LIM.time_ms)))
  end
  redis.call('SET', sk, head .. flags .. tail, 'KEEPTTL')
end

-- Does job `id` exist: its hash, or (pending, never claimed) its spec record alone.
local function job_exists(prefix, id)
  return redis.call('EXISTS', job_key(prefix, id), spec_key(prefix, id)) > 0
end

-- A job's keys go together: deleted (purge, trim, an unpended occurrence) or expired.
local function job_del(prefix, id)
  redis.call('DEL', job_key(prefix, id), spec_key(prefix, id))
end
local function job_expire(prefix, id, ttl)
  redis.call('PEXPIRE', job_key(prefix, id), ttl)
  redis.call('PEXPIRE', spec_key(prefix, id), ttl)
end

-- The dead key is a ZSET id -> dead_ms (O(log n) by id, listed by age). Data written by older
-- versions is a LIST (newest first); any script that touches the dead key converts it first, in
-- bounded steps: up to DEAD_MIGRATE_STEP ids per call move from the LIST's old end into the ZSET
-- `dead:migrating`, which is RENAMEd onto `dead` once the LIST is empty. While a migration is in
-- progress both keys hold dead ids and every function below reads both (none is ever lost).
local DEAD_MIGRATE_STEP = 1000
-- Retention (opt-in, `config` hash: dead_max_age_ms, dead_max_count) trims at most this many of
-- the oldest per script that parks (dead_trim).
local DEAD_TRIM_STEP = 100

-- One bounded migration step; returns the number of ids still on the old LIST (0: done).
local function dead_migrate(prefix, now)
  local dead, tmp = prefix .. 'dead', prefix .. 'dead:migrating'
  -- LLEN, not TYPE (the app ACL role has no TYPE): an error reply means the key is a ZSET.
  local listed = redis.pcall('LLEN', dead)
  if type(listed) ~= 'number' then return 0 end
  if listed == 0 then
    -- The LIST emptied by a hand (DEL) mid-way: the converted part becomes the dead key. Only
    -- a ZSET (ZCARD > 0: one that exists): a stray key of another type, with no dead key
    -- (LLEN of none is 0), is left alone for doctor; parks then start the dead ZSET afresh.
    local converted = redis.pcall('ZCARD', tmp)
    if type(converted) == 'number' and converted > 0 then redis.call('RENAME', tmp, dead) end
    return 0
  end
  local ids = redis.call('LRANGE', dead, -DEAD_MIGRATE_STEP, -1)
  for _, id in ipairs(ids) do
    -- pcall: an id parked by its id alone has a key that is not a hash (it died "now").
    local ms = redis.pcall('HGET', job_key(prefix, id), 'dead_ms')
    local score = parse_int(ms, 0, LIM.time_ms) or now
    redis.call('ZADD', tmp, score, id)
  end
  redis.call('LTRIM', dead, 0, -(#ids + 1))
  local left = redis.call('LLEN', dead)
  if left == 0 and redis.call('EXISTS', tmp) == 1 then redis.call('RENAME', tmp, dead) end
  return left
end

-- The ZSET new dead ids go to: `dead`, or `dead:migrating` while the old LIST is converted.
local function dead_zset(prefix, now)
  if dead_migrate(prefix, now) > 0 then return prefix .. 'dead:migrating' end
  return prefix .. 'dead'
end

-- Delete trimmed jobs for good: each id leaves the dead ZSET, and its keys go only while its
-- hash says 'dead'. A dead entry whose keys were deleted by hand frees the id, which enqueue
-- may take again: that live job is not the retention's to delete. An id parked by its id alone
-- (a key that is not a hash) keeps its key, as purge leaves it (doctor reports it).
local function dead_drop(prefix, zset, ids)
  for _, id in ipairs(ids) do
    redis.call('ZREM', zset, id)
    if redis.pcall('HGET', job_key(prefix, id), 'state') == 'dead' then job_del(prefix, id) end
  end
  return #ids
end

-- Opt-in retention, off unless the queue's config sets it: drop at most DEAD_TRIM_STEP of the
-- oldest dead jobs older than dead_max_age_ms or beyond dead_max_count; counted as dead_trimmed.
-- The step is per script, not per park: a script that parks many (a parent's children) would
-- otherwise trim a whole backlog in one call; the next parks trim the rest.
local dead_trim_left = DEAD_TRIM_STEP
local function dead_trim(prefix, zset, now)
  if dead_trim_left <= 0 then return 0 end
  local cfg = redis.pcall('HMGET', prefix .. 'config', 'dead_max_age_ms', 'dead_max_count')
  if type(cfg) ~= 'table' or (not cfg[1] and not cfg[2]) then return 0 end
  local max_age, max_count = parse_int(cfg[1], 0, LIM.time_ms), parse_int(cfg[2], 0, LIM.fence)
  local budget, trimmed = dead_trim_left, 0
  if max_count then
    local excess = math.min(redis.call('ZCARD', zset) - max_count, budget)
    if excess > 0 then
      trimmed = trimmed + dead_drop(prefix, zset, redis.call('ZRANGE', zset, 0, excess - 1))
    end
  end
  if max_age and trimmed < budget then
    local old = redis.call('ZRANGE', zset, '-inf', '(' .. fmt(now - max_age), 'BYSCORE', 'LIMIT',
      0, budget - trimmed)
    trimmed = trimmed + dead_drop(prefix, zset, old)
  end
  bump_stat(prefix, now, 'dead_trimmed', trimmed)
  dead_trim_left = dead_trim_left - trimmed
  return trimmed
end

-- A dead letter's score: now, but after the newest one's while that is later than now. A
-- server clock stepped back would otherwise put the job just parked first in the count
-- retention's line (lowest score, then id, first): deleted at once, while the older ones
-- stayed; one ms after it, not equal (a tie went by id: a job enqueued earlier, parked now,
-- was the one deleted). Only up to 366 days ahead (LIM.ttl_ms), well past any real step (a VM
-- restored from a snapshot days old; a 1-day cap deleted each job parked after a 2-day step,
-- its record with it): a score written by hand (inf, 1e15, year 3000) must not be every later
-- park's, out of the age retention.
local function dead_score(zset, now)
  local top = tonumber(redis.call('ZRANGE', zset, -1, -1, 'WITHSCORES')[2])
  return (top and top > now and top <= now + LIM.ttl_ms) and math.floor(top) + 1 or now
end

-- Park a job for a human: out of due and leased, into the dead ZSET at now (newest last).
-- `at` (repair only): the time it died, kept as its age.
local function dead_letter(prefix, id, reason, now, at)
  redis.call('ZREM', prefix .. 'due', id)
  redis.call('ZREM', prefix .. 'leased', id)
  redis.call('HSET', job_key(prefix, id), 'state', 'dead', 'dead_reason', reason,
    'dead_ms', fmt(at or now))
  redis.call('HDEL', job_key(prefix, id), 'worker')  -- held by none (models.Job.worker)
  local zset = dead_zset(prefix, now)
  redis.call('ZADD', zset, at or dead_score(zset, now), id)
  if zset == prefix .. 'dead' then dead_trim(prefix, zset, now) end
end

-- Take an id off the dead key(s); the number of entries removed (0: it was not there). The one
-- place (with dead_letter, dead_letter_id, dead_size) that knows the dead key's type.
local function dead_unlist(prefix, id, now)
  if dead_migrate(prefix, now) == 0 then return redis.call('ZREM', prefix .. 'dead', id) end
  return redis.call('ZREM', prefix .. 'dead:migrating', id)
    + redis.call('LREM', prefix .. 'dead', 0, id)
end

local function dead_size(prefix, now)
  if dead_migrate(prefix, now) == 0 then return redis.call('ZCARD', prefix .. 'dead') end
  return redis.call('LLEN', prefix .. 'dead') + redis.call('ZCARD', prefix .. 'dead:migrating')
end

-- Checks before a script's first write (lib/util.lua key_type_err): nil, or the CORRUPT reply.
local function zset_err(prefix, name)
  return key_type_err(prefix .. name, name, 'zset')
end

-- The same for the dead key(s) a park writes: `dead` a ZSET, or (an older version's data) a
-- LIST being converted through the ZSET dead:migrating (read only then: with `dead` a ZSET or
-- none, the conversion leaves a stray one of another type alone).
local function dead_err(prefix)
  if type(redis.pcall('ZCARD', prefix .. 'dead')) == 'number' then return nil end
  if type(redis.pcall('LLEN', prefix .. 'dead')) ~= 'number' then
    return corrupt_err('dead', 'zset')
  end
  return zset_err(prefix, 'dead:migrating')
end

-- Out of leased (if there), into due at run_at: retry, release, a reaped lease, a requeue.
local function to_due(prefix, id, run_at)
  redis.call('ZREM', prefix .. 'leased', id)
  redis.call('ZADD', prefix .. 'due', run_at, id)
end

-- Park an id whose key is not a hash (it cannot take the dead fields): out of due and leased,
-- into the dead ZSET by id alone (doctor reports it).
local function dead_letter_id(prefix, id, now)
  redis.call('ZREM', prefix .. 'due', id)
  redis.call('ZREM', prefix .. 'leased', id)
  local zset = dead_zset(prefix, now)
  redis.call('ZADD', zset, dead_score(zset, now), id)
end

-- The 11 reply fields of one leased job, in the order claim's contract header gives
-- (scheduler's codec reads them in this order): appended to `out`. The last is its start
-- deadline ('' for none): a worker that holds a claimed job back (prefetched behind others)
-- gives it back instead of starting it after that.
local CLAIM_FIELDS = 11
local function pack_job(out, id, token, attempts, r)
  local b = #out
  out[b + 1] = id; out[b + 2] = token; out[b + 3] = attempts; out[b + 4] = r.max_attempts
  out[b + 5] = r.task; out[b + 6] = r.payload; out[b + 7] = r.run_at_s or fmt(r.run_at_ms)
  out[b + 8] = r.backoff; out[b + 9] = r.timeout_ms; out[b + 10] = r.schedule
  local by = ''
  local sp = r.spec
  if sp and sp.flags ~= '' and sp.flags ~= 'k' then
    local _, deadline = spec_flags(sp.flags)
    if deadline then by = fmt(deadline) end
  end
  -- A schedule's run: its hash's start_by_ms (claim.lua read_claimable).
  if by == '' and r.start_by then by = fmt(r.start_by) end
  out[b + 11] = by
end

-- Append one entry to the job's error history (JSON array, newest last, at most 10 kept).
-- The kept entries are copied in one pass (a hand-written history of any length costs one
-- decode, not a shift per dropped entry); a value that is not an array (a hand-written JSON
-- object) counts as no history.
local ERRORS_KEPT = 10
local function push_error(jk, etype, message, traceback, attempt, now)
  local raw = redis.call('HGET', jk, 'errors')
  local old = nil
  if raw then
    local ok, decoded = pcall(cjson.decode, raw)
    if ok and type(decoded) == 'table' then old = decoded end
  end
  -- The last ERRORS_KEPT - 1 old entries, then the new one (a JSON object decodes to a table
  -- whose # is 0: nothing is copied).
  local errs = {}
  if old then
    for i = math.max(1, #old - ERRORS_KEPT + 2), #old do errs[#errs + 1] = old[i] end
  end
  errs[#errs + 1] = { type = etype, message = message, traceback = traceback,
    attempt = attempt, at_ms = fmt(now) }
  redis.call('HSET', jk, 'errors', cjson.encode(errs), 'last_error_type', etype,
    'last_error', message)
end
