-- Flow control (docs/flow-control.md): priorities, per-key concurrency limits, rate limits.
-- `due` stays the one truth for "this job is due"; the keys below are indexes and hold sets:
--   flow:levels        SET   priority levels (1..9) whose index may hold entries
--   flow:pdue:<p>      ZSET  id -> run_at_ms of due jobs of priority p (advisory: claim checks due)
--   flow:ck:<key>      ZSET  id -> lease_until_ms granted by claim: the key's leases
--   flow:ckheld:<key>  ZSET  id -> its place (run_at, less by priority): set aside, the key full
--   flow:rate:<key>    ZSET  '<window>:<count>:<id>:<token>' -> claim ms: the log of starts
--   flow:rheld         ZSET  id -> the next slot's ms: set aside by a full rate window
--   flow:held          ZSET  id -> run_at_ms: every job set aside (counts, cancel, doctor)
-- A job set aside keeps state 'due' and says why in its `flow_reason` field.
-- @include "lib/util.lua"
-- @include "lib/job.lua"
-- @include "lib/result.lua"

-- A copy of scheduler/core/flow.py FLOW_LIMITS (tests/test_flow_unit.py checks they agree).
local FLOW_LIM = { priority = 9, climit = 10000, rate_count = 100000, rate_window_ms = 86400000,
  after = 100 }
-- Jobs one claim may set aside beyond its batch: bounds a claim's work behind a hot key (about
-- 75 us each: 1,000 held a claim of 100 for 80-90 ms, every client of the server waiting). A
-- backlog larger than this is set aside over successive claims (each one sets aside this many).
local FLOW_HOLD_BUDGET = 200
-- Of a claim's batch, the part that may be set aside too: a claim of 1,000 behind a full key set
-- aside 1,200 jobs (about 90 ms); now at most this + FLOW_HOLD_BUDGET. Jobs it may take are
-- still examined up to the batch; the rest of a backlog is set aside by the next claims.
local FLOW_ASIDE_BATCH = 100
-- The most jobs one claim of `limit` may set aside or park, and the most rate-held jobs whose
-- slot has come it brings back (or gives a later slot): a claim of 1,000 brought back 1,200.
local function flow_moved_max(limit) return math.min(limit, FLOW_ASIDE_BATCH) + FLOW_HOLD_BUDGET end
-- A job claim parks because a flow key it needs is of another type (written by hand).
local FLOW_BAD = 'invalid flow key: '
local FLOW_AGING_MS = 60000  -- default priority_aging_ms (config hash), the starvation bound
-- The queue's priority_aging_ms, read once per script (of one queue: its prefix).
local flow_aging_of = nil
local flow_aging_ms = FLOW_AGING_MS
local function flow_aging(prefix)
  if flow_aging_of ~= prefix then
    flow_aging_of = prefix
    flow_aging_ms = parse_int(redis.pcall('HGET', prefix .. 'config', 'priority_aging_ms'), 0,
      LIM.delay_ms) or FLOW_AGING_MS
  end
  return flow_aging_ms
end
-- A held job's place in its key's hold set: its run_at less priority_aging_ms / 9 per priority
-- level, so a job of priority 9 goes ahead of the key's lower ones held up to the aging time
-- before it, and none waits more than that behind newer ones (the aged pass's bound). The
-- previous version scored run_at alone: its entries read as priority 0; and it reads a place
-- as an earlier run_at, of a job due already.
local function flow_ck_score(prefix, run_at, priority)
  if priority <= 0 then return run_at end
  return run_at - math.floor(priority * flow_aging(prefix) / FLOW_LIM.priority)
end
local FLOW_READ = { 'priority', 'ckey', 'climit', 'rkey', 'rcount', 'rwindow' }

-- The flow fields of one job from six strings (ARGV or stored; nil = unset). Returns a table,
-- or nil and the bad field's name.
local FLOW_PLAIN = { priority = 0, ckey = '', climit = 0, rkey = '', rcount = 0, rwindow = 0 }
local function flow_parse(p, ckey, climit, rkey, rcount, rwindow)
  -- The plain path (no flow field stored): one shared table, nothing parsed.
  if not (p or ckey or rkey) then return FLOW_PLAIN end
  local f = { priority = 0, ckey = ckey or '', climit = 0, rkey = rkey or '', rcount = 0,
    rwindow = 0 }
  if p and p ~= '0' then
    f.priority = parse_int(p, 0, FLOW_LIM.priority)
    if f.priority == nil then return nil, 'priority' end
  end
  if f.ckey ~= '' then
    if not task_ok(f.ckey) then return nil, 'ckey' end
    f.climit = parse_int(climit, 1, FLOW_LIM.climit)
    if f.climit == nil then return nil, 'climit' end
  end
  if f.rkey ~= '' then
    if not task_ok(f.rkey) then return nil, 'rkey' end
    f.rcount = parse_int(rcount, 1, FLOW_LIM.rate_count)
    f.rwindow = parse_int(rwindow, 1, FLOW_LIM.rate_window_ms)
    if f.rcount == nil then return nil, 'rcount' end
    if f.rwindow == nil then return nil, 'rwindow' end
  end
  return f
end

-- enqueue's flow ARGV field ('' = plain; else 'priority|ckey|climit|rkey|count|window|parents',
-- scheduler/core/flow.py flow_field): the parsed flow, or nil and the error reply.
local function flow_arg(text)
  if text == '' then return flow_parse(nil, nil, nil, nil, nil, nil) end
  local p, ck, cl, rk, rc, rw, parents = string.match(text,
    '^(%d+)|([^|]*)|(%d+)|([^|]*)|(%d+)|(%d+)|([^|]*)$')
  if p == nil then return nil, redis.error_reply('BAD_ARGUMENT flow=' .. string.sub(text, 1, 60)) end
  local f, bad = flow_parse(p, ck, cl, rk, rc, rw)
  if f == nil then return nil, redis.error_reply('BAD_ARGUMENT ' .. bad .. '=') end
  if parents ~= '' then
    local after = {}
    for pid in string.gmatch(parents, '%S+') do
      if not job_id_ok(pid) or #after >= FLOW_LIM.after then
        return nil, redis.error_reply('BAD_ARGUMENT after=' .. string.sub(pid, 1, 40))
      end
      after[#after + 1] = pid
    end
    if f == FLOW_PLAIN then f = flow_parse('0', '', '0', '', '0', '0') end
    f.after = after
  end
  return f
end

-- Whether a parsed flow uses anything (the plain path skips every flow call); a stored key
-- whose limit cannot be read (flow_from's ckey_lost) counts.
local function flow_used(f)
  return f.priority > 0 or f.ckey ~= '' or f.rkey ~= '' or f.after ~= nil or f.ckey_lost ~= nil
end

-- The job-hash fields of a flow (only what is set: a plain job stores none). A flow read from
-- a stored one (a schedule's, for each of its runs) whose key has a limit edited by hand into
-- no number gives the key at the strictest limit, 1: every later run made plain would pass the
-- limit the schedule was given (tests/test_flow_hand_edits.py).
local function flow_store(jk, f)
  if f.priority > 0 then redis.call('HSET', jk, 'priority', fmt(f.priority)) end
  if f.ckey ~= '' then redis.call('HSET', jk, 'ckey', f.ckey, 'climit', fmt(f.climit)) end
  if f.ckey_lost then redis.call('HSET', jk, 'ckey', f.ckey_lost, 'climit', '1') end
  if f.rkey ~= '' then
    redis.call('HSET', jk, 'rkey', f.rkey, 'rcount', fmt(f.rcount), 'rwindow', fmt(f.rwindow))
  end
end

-- A stored flow from the six FLOW_READ values at v[i] .. v[i + 5] of an HMGET reply (false =
-- unset), read strictly; a field edited by hand reads as unset, and with it only its own part
-- (the priority; the key and its limit; the rate key, count and window): claim then treats
-- that part as plain rather than parking the job for an advisory field, and the other parts
-- are read as stored, so a bad priority or rate field never hides a good key (the key's slot
-- would not be released, its held jobs never promoted). Lets a caller that reads the job's
-- hash anyway take the flow fields in the same HMGET.
local function flow_from(v, i)
  local p, ck, cl, rk, rc, rw = v[i] or nil, v[i + 1] or nil, v[i + 2] or nil, v[i + 3] or nil,
    v[i + 4] or nil, v[i + 5] or nil
  local f = flow_parse(p, ck, cl, rk, rc, rw)
  if f then return f end
  -- Some field is bad: each part on its own (flow_parse of no field is FLOW_PLAIN).
  local fp = flow_parse(p, nil, nil, nil, nil, nil) or FLOW_PLAIN
  local fk = flow_parse(nil, ck, cl, nil, nil, nil) or FLOW_PLAIN
  local fr = flow_parse(nil, nil, nil, rk, rc, rw) or FLOW_PLAIN
  -- A good key with a limit edited by hand: claim reads the job as plain, but a slot it took
  -- before the edit is still freed when its lease ends, or the key's held jobs would wait for
  -- ever.
  local lost = fk.ckey == '' and ck and task_ok(ck) and ck or nil
  return { priority = fp.priority, ckey = fk.ckey, climit = fk.climit, rkey = fr.rkey,
    rcount = fr.rcount, rwindow = fr.rwindow, ckey_lost = lost }
end

local function flow_load(jk)
  return flow_from(redis.call('HMGET', jk, unpack(FLOW_READ)), 1)
end

-- The flow of a job whose priority, ckey and rkey the caller has read (HMGET values, false =
-- unset; claim's read_claimable, fail's lease_check): only the limits its key or rate window
-- needs are read, so no field is read twice and the plain path's read stays three fields.
local function flow_rest(jk, p, ckey, rkey)
  local v = { p, ckey, false, rkey, false, false }
  if ckey and rkey then
    local l = redis.call('HMGET', jk, 'climit', 'rcount', 'rwindow')
    v[3], v[5], v[6] = l[1], l[2], l[3]
  elseif ckey then
    v[3] = redis.call('HGET', jk, 'climit')
  elseif rkey then
    local l = redis.call('HMGET', jk, 'rcount', 'rwindow')
    v[5], v[6] = l[1], l[2]
  end
  return flow_from(v, 1)
end

-- The flow of a job whose ckey (set) the caller has read (complete's one HMGET, which reads no
-- more flow fields so that the plain path stays as it was): the other five in one HMGET, parsed
-- as flow_load would (a hand-edited priority or rate field leaves the key and its limit read).
local function flow_keyed(jk, ckey)
  local v = redis.call('HMGET', jk, 'priority', 'climit', 'rkey', 'rcount', 'rwindow')
  return flow_from({ v[1], ckey, v[2], v[3], v[4], v[5] }, 1)
end

-- Put a due job of priority p > 0 into its level's index. pcall: the index is advisory (the job
-- is in due, where claim's last pass finds it), and a key of another type (written by hand)
-- must not make a move into due raise after its first write.
local function flow_index(prefix, id, priority, run_at)
  if priority > 0 then
    redis.pcall('ZADD', prefix .. 'flow:pdue:' .. priority, run_at, id)
    redis.pcall('SADD', prefix .. 'flow:levels', priority)
  end
end

-- Out of its level's index (pcall, as for the ZADD above): a job that leaves due another way
-- than through its index's own scan. Claim drops an entry only when that scan meets it, which
-- a full batch never gets to, nor to an entry due later: it would stay.
local function flow_unindex(prefix, id, priority)
  if priority > 0 then redis.pcall('ZREM', prefix .. 'flow:pdue:' .. priority, id) end
end

-- Back into due from a hold set at its own run_at (order within a key is kept). Only a job
-- still in flow:held moves: a stale hold entry (the job was cancelled or repaired since) must
-- never put a leased or finished job back into due. A job key of another type (written by
-- hand) cannot take the hash writes: it goes into due alone, where claim parks it, instead of
-- raising in the script that freed its slot (complete, fail, ...) after that one's first write.
-- Returns false only when `due` is of another type (edited by hand): the job stays held, and
-- the caller keeps it in its own set (a job in no set would be lost; this runs after the
-- caller's first write, so it may not raise).
local function flow_unhold(prefix, id, run_at)
  -- 0: not held (already moved). An error (flow:held edited into another type): the caller's
  -- own hold set had it, so it was held: it goes to due rather than nowhere.
  local held = redis.pcall('ZREM', prefix .. 'flow:held', id)
  if held == 0 then return true end
  if type(redis.pcall('ZADD', prefix .. 'due', run_at, id)) ~= 'number' then
    if held == 1 then redis.call('ZADD', prefix .. 'flow:held', run_at, id) end
    return false
  end
  local jk = job_key(prefix, id)
  if type(redis.pcall('HDEL', jk, 'flow_reason')) ~= 'number' then return true end
  flow_index(prefix, id, flow_load(jk).priority, run_at)
  return true
end

-- Live leases of a key, or nil when its slot set is of another type (written by hand). A member
-- whose score (claim's lease end, lowered by a heartbeat that shortens the lease: flow_beat)
-- has passed is checked against leased (a heartbeat may have extended it: refreshed) or
-- dropped (lapsed or gone): a lapsed lease frees its slot at that instant. At most
-- FLOW_CK_STEP members checked per script (a fleet's crash left 10,000 lapsed leases of one key
-- to check in one claim): one not checked yet counts as live, so the key is never over its
-- limit, and a later script (each reap of one of those leases ends in here) checks the rest.
local FLOW_CK_STEP = 400
local flow_ck_left = FLOW_CK_STEP
local function flow_ck_live(prefix, key, now)
  local ck = prefix .. 'flow:ck:' .. key
  local old = redis.pcall('ZRANGE', ck, '-inf', now, 'BYSCORE', 'LIMIT', 0, flow_ck_left)
  if old.err then return nil end
  flow_ck_left = flow_ck_left - #old
  for _, id in ipairs(old) do
    local s = redis.call('ZSCORE', prefix .. 'leased', id)
    if s and tonumber(s) > now then redis.call('ZADD', ck, s, id) else redis.call('ZREM', ck, id) end
  end
  return redis.call('ZCARD', ck)
end

-- Move up to `n` of the key's held jobs (first place first) back into due, each at its run_at
-- (flow:held's score; the place, when flow:held is of another type): at most
-- FLOW_PROMOTE_STEP per script (a key of limit 10,000 freed whole, its 10,000 held jobs went
-- in one claim), but always one, so a key with room never strands its held jobs; the ones
-- promoted end and promote the rest.
local FLOW_PROMOTE_STEP = 400
local flow_promote_left = FLOW_PROMOTE_STEP
local function flow_ck_promote(prefix, key, n)
  n = math.min(n, math.max(flow_promote_left, 1))
  if n <= 0 then return end
  local hk = prefix .. 'flow:ckheld:' .. key
  local ids = redis.pcall('ZRANGE', hk, 0, n - 1, 'WITHSCORES')
  if ids.err then return end  -- a hold set of another type: nothing to promote
  flow_promote_left = flow_promote_left - #ids / 2
  for i = 1, #ids, 2 do
    local run_at = redis.pcall('ZSCORE', prefix .. 'flow:held', ids[i])
    if type(run_at) ~= 'string' then run_at = ids[i + 1] end
    if flow_unhold(prefix, ids[i], run_at) then redis.call('ZREM', hk, ids[i]) end
  end
  -- An idle worker may be sleeping until a lease ends: this job is due now.
  if #ids > 0 then wake(prefix .. 'wake') end
end

-- The key's first held jobs (by place) whose own limit has room go back to due, in order, and at
-- least `least` of them (the limit of the job whose lease ended): the first without room stops
-- the count (the key keeps its order: it drains to that one). Run when a job of the key starts and
-- when one's lease ends: a job held behind an older one of its key, or held at a full key by a
-- job of a lower limit, waits until its own limit has room, not until the next lease of the
-- key ends. Before, once the job ahead started (or such a lease ended) it stayed held with its
-- limit's room free until then: an hour behind hour-long jobs (tests/test_flow_held_room.py).
-- `live`: the key's live leases when the caller has them. One read when none is held; at most
-- the script's promote step of jobs (and one per call past it).
local function flow_ck_next(prefix, key, now, live, least)
  local hk = prefix .. 'flow:ckheld:' .. key
  local head
  -- A stale head (an id no longer held, left by a hand edit) is dropped, as the FIFO check
  -- drops one: let go in a held job's stead, it left the key empty with its jobs held. Only
  -- a sure "not held" drops it: flow:held of another type (an error) keeps every entry.
  for _ = 1, 3 do
    head = redis.pcall('ZRANGE', hk, 0, 0)
    if head.err or not head[1] then return end
    if redis.pcall('ZSCORE', prefix .. 'flow:held', head[1]) ~= false then break end
    redis.call('ZREM', hk, head[1])
    head = nil
  end
  if not head then return end
  live = live or flow_ck_live(prefix, key, now)
  if not live then return end
  local function room(id, ahead)
    local lim = parse_int(redis.pcall('HGET', job_key(prefix, id), 'climit'), 1,
      FLOW_LIM.climit) or 1
    return lim - live - ahead
  end
  local n = math.min(room(head[1], 0), math.max(flow_promote_left, 1))
  local go = n > 0 and 1 or 0
  if n > 1 then
    for i, id in ipairs(redis.call('ZRANGE', hk, 1, n - 1)) do
      if room(id, i) <= 0 then break end
      go = go + 1
    end
  end
  flow_ck_promote(prefix, key, math.max(go, least))
end

-- A job leaves leased (complete, fail, release, cancel, a reaped lease, a park): its slot is
-- free, and the key's held jobs may run in the free slots. `f`: the job's flow when the caller
-- read it in this script (no move writes the flow fields; a dead-letter trim may delete the
-- whole hash, so a flow read before the move is the one to trust), else read here; so with
-- the helpers below. A slot set of another type (written by hand) frees and promotes nothing,
-- rather than raise after the caller's first write.
local function flow_release(prefix, id, now, f)
  f = f or flow_load(job_key(prefix, id))
  -- A key whose limit cannot be read (flow_from): one held job may go while none is leased
  -- (claim checks it against its own limit), so the key's held jobs are never stranded.
  local key, limit = f.ckey, f.climit
  if key == '' and f.ckey_lost then key, limit = f.ckey_lost, 1 end
  if key == '' then return end
  redis.pcall('ZREM', prefix .. 'flow:ck:' .. key, id)
  local live = flow_ck_live(prefix, key, now)
  if live then flow_ck_next(prefix, key, now, live, limit - live) end
end

-- to_due (lib/job.lua) for every move into due: the slot it held is freed and a prioritized job
-- is put back into its level's index.
local function flow_to_due(prefix, id, run_at, now, f)
  to_due(prefix, id, run_at)
  f = f or flow_load(job_key(prefix, id))
  if f.ckey ~= '' or f.ckey_lost then flow_release(prefix, id, now, f) end
  flow_index(prefix, id, f.priority, run_at)
end

-- Set a due job aside: out of due, into its hold set (`set`, a key name after the prefix) and
-- flow:held, with the reason; true. A hold set of another type (written by hand) cannot take
-- it (held there, nothing would bring it back): nothing is written, and nil and the reason to
-- park it with are returned.
local function flow_hold(prefix, id, jk, run_at, set, score, reason)
  if type(redis.pcall('ZADD', prefix .. set, score, id)) ~= 'number' then
    return nil, FLOW_BAD .. set
  end
  if type(redis.pcall('ZADD', prefix .. 'flow:held', run_at, id)) ~= 'number' then
    redis.call('ZREM', prefix .. set, id)
    return nil, FLOW_BAD .. 'flow:held'
  end
  redis.call('ZREM', prefix .. 'due', id)
  redis.call('HSET', jk, 'flow_reason', reason)
  return true
end

-- The rate log flow:rate:<key>: member '<window>:<count>:<id>:<token>' -> claim ms, one per
-- start (the token is unique per claim: a reused id adds a start, never overwrites one). The
-- newest member carries the log's span: the largest window and count of the key's jobs that
-- started or were set aside since the log was last empty. The log keeps the latest <count>
-- starts of the last <window> and lives <window> + 1 s after its last write, so a job of a
-- shorter window or smaller count never trims nor expires a start a longer one still counts.
-- Fixed width: among the starts of one ms (one claim) the member sorted last carries the
-- largest span. Claim reads a log's span once and settles the log (trim, expiry) once, after
-- its last start: the logs it touched (rk -> {w, n, wrote, carried}), in the order met.
local FLOW_RATE_LOGS = {}
local FLOW_RATE_ORDER = {}

local function flow_rate_member(w, n, rest)
  return string.format('%08d:%06d:%s', w, n, rest)
end

-- A log's span ({w = 0, n = 0}: empty, or a newest member of another form), read once.
local function flow_rate_span(rk)
  local sp = FLOW_RATE_LOGS[rk]
  if sp then return sp end
  local top = redis.call('ZRANGE', rk, -1, -1)
  local w, n = string.match(top[1] or '', '^(%d+):(%d+):')
  sp = { w = parse_int(w, 0, FLOW_LIM.rate_window_ms) or 0,
    n = parse_int(n, 0, FLOW_LIM.rate_count) or 0, wrote = false, carried = true }
  FLOW_RATE_LOGS[rk] = sp
  FLOW_RATE_ORDER[#FLOW_RATE_ORDER + 1] = rk
  return sp
end

-- The span grows to a job's window and count (a job set aside widens it at once, so the starts
-- until its slot are kept for it); the log's newest member no longer carries it.
local function flow_rate_widen(rk, f)
  local sp = flow_rate_span(rk)
  if f.rwindow <= sp.w and f.rcount <= sp.n then return sp end
  sp.w, sp.n = math.max(sp.w, f.rwindow), math.max(sp.n, f.rcount)
  sp.wrote, sp.carried = true, false
  return sp
end

-- Claim's last rate step: each log it wrote has its newest member carry the span (rewritten
-- when a job set aside after the last start widened it), keeps the latest <count> starts
-- inside <window> (a start at or before now - window is outside every job's window) and lives
-- <window> + 1 s (never lowered: the span only grows). Nothing on the plain path.
local function flow_rate_settle(now)
  for _, rk in ipairs(FLOW_RATE_ORDER) do
    local sp = FLOW_RATE_LOGS[rk]
    if sp.wrote then
      if not sp.carried then
        local top = redis.call('ZRANGE', rk, -1, -1, 'WITHSCORES')
        redis.call('ZREM', rk, top[1])
        redis.call('ZADD', rk, top[2],
          flow_rate_member(sp.w, sp.n, string.match(top[1], '^%d+:%d+:(.*)$') or top[1]))
      end
      -- One trim for both bounds: the starts older than the count-th latest (its ties kept; by
      -- score, so the app role's ACL in docs/security.md needs no ZREMRANGEBYRANK) and those at
      -- or before now - window.
      local cut = redis.call('ZRANGE', rk, -sp.n, -sp.n, 'WITHSCORES')
      local s = tonumber(cut[2])
      if s and s > now - sp.w then
        redis.call('ZREMRANGEBYSCORE', rk, '-inf', '(' .. cut[2])
      else
        redis.call('ZREMRANGEBYSCORE', rk, '-inf', now - sp.w)
      end
      redis.call('PEXPIRE', rk, sp.w + 1000)
    end
  end
end

-- A rate-held job's reason: its window and the slot it waits for (scheduler/dashboard/reasons.py
-- reads it back).
local function flow_rate_reason(f, slot)
  return 'rate window ' .. f.rkey .. ' (' .. fmt(f.rcount) .. ' per ' .. fmt(f.rwindow) ..
    ' ms) until ' .. fmt(slot)
end

-- The slot at which a job's rate window has room again, or false when it has room now, or nil
-- when the log is of another type (written by hand). The window is full while the job's
-- count-th latest start is inside it: one read, whatever other windows the key's log serves.
-- A start stamped later than now (the server clock stepped back, an edit) is moved to now, so
-- it holds its key one window from here, not until the clock has caught up with it (a step
-- back of an hour held a 1-per-second key for the hour). At most FLOW_CLAMP_STEP starts per
-- script (a log of 100,000 starts, all late, held the server 290 ms in one claim): the rest
-- move at the next claims that read the log, and until then every read of a start's time
-- takes it as at most now (flow_rate_at). The first answer is a whole clamp's; a start not
-- moved yet counts as one at the time of each read, so a short window may stay shut up to one
-- window more per 1,000 late starts (never over its limit). No reply: a log of another type
-- is left to the caller's read. Nothing is written when no start is later than now.
local FLOW_CLAMP_STEP = 1000
local flow_clamp_left = FLOW_CLAMP_STEP
local function flow_rate_clamp(rk, now)
  if flow_clamp_left <= 0 then return end
  local late = redis.pcall('ZRANGE', rk, '(' .. fmt(now), '+inf', 'BYSCORE', 'LIMIT', 0,
    flow_clamp_left)
  if late.err then return end
  flow_clamp_left = flow_clamp_left - #late
  for _, m in ipairs(late) do redis.call('ZADD', rk, now, m) end
end

-- A start's time as read from a rate log's score: a late one (not yet clamped) counts as now.
local function flow_rate_at(score, now)
  local s = tonumber(score)
  return s and math.min(s, now)
end

local function flow_rate_slot(rk, f, now)
  flow_rate_clamp(rk, now)
  local nth = redis.pcall('ZRANGE', rk, -f.rcount, -f.rcount, 'WITHSCORES')
  if nth.err then return nil end
  local s = flow_rate_at(nth[2], now)
  if not s or s <= now - f.rwindow then return false end
  return math.floor(s) + f.rwindow
end

-- The key's first held job when its place is before `score`, the place of the job `id` claim
-- examines, else nil: a key's held jobs go in order of place (docs/flow-control.md, 'Priority
-- inside a key'), so that job waits behind it though the key has room for its own limit.
-- Before, a held job of a lower limit than its key's newer jobs (a limit raised in a deploy)
-- could start only when none of the key was leased, and newer traffic kept it held for ever
-- (tests/test_flow_mixed_limits.py). A stale head (no longer held) is dropped; a hold set of
-- another type reads as none (claim's hold parks the job).
local function flow_ck_ahead(prefix, key, id, score)
  local hk = prefix .. 'flow:ckheld:' .. key
  for _ = 1, 3 do
    local h = redis.pcall('ZRANGE', hk, 0, 0, 'WITHSCORES')
    if h.err or not h[1] or h[1] == id or not (tonumber(h[2]) < score) then return nil end
    if type(redis.pcall('ZSCORE', prefix .. 'flow:held', h[1])) == 'string' then return h[1] end
    redis.call('ZREM', hk, h[1])
  end
  return nil
end

-- May claim lease this due job now? true: yes; false: it is set aside (still due); nil and a
-- reason: a flow key it needs is of another type (written by hand), and claim parks it, as it
-- parks a job key that is not a hash, rather than run it past a limit it cannot read or set it
-- aside where nothing would bring it back. `f` is the job's parsed flow, `run_at` its run_at_ms.
local function flow_admit(prefix, id, jk, f, run_at, now)
  local live = 0
  if f.ckey ~= '' then
    live = flow_ck_live(prefix, f.ckey, now)
    if live == nil then return nil, FLOW_BAD .. 'flow:ck:' .. f.ckey end
    local place = flow_ck_score(prefix, run_at, f.priority)
    local ahead = live < f.climit and flow_ck_ahead(prefix, f.ckey, id, place)
    if ahead then
      -- The older one goes first when its own limit has room now (claim meets it in a later
      -- round); else the key drains to it, this one held behind it.
      local lim = parse_int(redis.pcall('HGET', job_key(prefix, ahead), 'climit'), 1,
        FLOW_LIM.climit) or 1
      flow_ck_promote(prefix, f.ckey, lim - live)
    end
    if live >= f.climit or ahead then
      -- The reason says which: the key is full, or it has room and this job waits its turn
      -- behind one placed before it, older or of higher priority (scheduler/dashboard/reasons.py
      -- reads both back). Before, both read 'limited by key', as if a key with room had none.
      local why = 'limited by key ' .. f.ckey .. ' (' .. fmt(f.climit) .. ' leased)'
      if ahead then
        why = 'waiting behind job ' .. string.sub(ahead, 1, 128) .. ' of key ' .. f.ckey
          .. ' (' .. fmt(live) .. ' of ' .. fmt(f.climit) .. ' leased)'
      end
      local ok, bad = flow_hold(prefix, id, jk, run_at, 'flow:ckheld:' .. f.ckey, place, why)
      return ok and false, bad
    end
  end
  if f.rkey ~= '' then
    local rk = prefix .. 'flow:rate:' .. f.rkey
    local slot = flow_rate_slot(rk, f, now)
    if slot == nil then return nil, FLOW_BAD .. 'flow:rate:' .. f.rkey end
    if slot then
      local ok, bad = flow_hold(prefix, id, jk, run_at, 'flow:rheld', slot,
        flow_rate_reason(f, slot))
      if not ok then return nil, bad end
      flow_rate_widen(rk, f)
      -- The key's free slot is not taken by this job: its held jobs may use it (a job is
      -- held by its key only while the key is full).
      if f.ckey ~= '' then flow_ck_promote(prefix, f.ckey, f.climit - live) end
      return false
    end
  end
  return true
end

-- Claim leased the job (flow_admit read both keys: they are of the right type): it takes a slot
-- of its key and a start in its rate log (settled by flow_rate_settle after claim's last), and
-- leaves its priority index (taken by the aged or the last pass, its entry would stay).
local function flow_leased(prefix, id, f, now, lease_until, token)
  flow_unindex(prefix, id, f.priority)
  if f.ckey ~= '' then
    redis.call('ZADD', prefix .. 'flow:ck:' .. f.ckey, lease_until, id)
    flow_ck_next(prefix, f.ckey, now, nil, 0)
  end
  if f.rkey ~= '' then
    local rk = prefix .. 'flow:rate:' .. f.rkey
    local sp = flow_rate_widen(rk, f)
    redis.call('ZADD', rk, now, flow_rate_member(sp.w, sp.n, id .. ':' .. token))
    sp.wrote, sp.carried = true, true
  end
end

-- A heartbeat shortened a lease (to `lease_until`): a slot's score in flow:ck:<key> must never
-- be later than its lease's end, or the slot would be counted after the lease lapsed
-- (flow_ck_live checks leased only once the score has passed); a longer lease needs nothing (a
-- passed score is refreshed there). LT: only ever lowered; XX: a slot already freed stays
-- free; pcall: a slot set of another type (written by hand) is left alone.
local function flow_beat(prefix, id, ckey, lease_until)
  redis.pcall('ZADD', prefix .. 'flow:ck:' .. ckey, 'XX', 'LT', lease_until, id)
end

-- Whether a flow:rheld entry (id, slot) was written by a clock since stepped back: its slot is
-- later than now + the longest window, or than now + its job's window (one HGET; a window that
-- cannot be read: not stepped).
local function flow_rate_stepped(prefix, e, now)
  local slot = tonumber(e[2])
  if slot > now + FLOW_LIM.rate_window_ms then return true end
  local w = redis.pcall('HGET', job_key(prefix, e[1]), 'rwindow')
  w = type(w) == 'string' and parse_int(w, 1, FLOW_LIM.rate_window_ms)
  return w and slot > now + w or false
end

-- The flow:rheld entries (id, slot, ...) from the first whose slot has not come, up to `room`,
-- when that one or the last entry is stepped (a clock step back: see below), else nil. Per
-- claim whose batch has room: a read of those two entries and of their jobs' windows, nothing
-- more while no clock stepped. The last is read too because a stepped entry of a short window
-- may sit behind one of a longer window whose slot is valid (its slot later: the clock ahead
-- wrote it). A stepped entry that is neither, or lies past `room` entries, is met by the
-- claims after, once the entries ahead of it have come (at most their window).
local function flow_rate_ahead(prefix, rh, now, room)
  if room <= 0 then return nil end
  local head = redis.pcall('ZRANGE', rh, '(' .. fmt(now), '+inf', 'BYSCORE', 'LIMIT', 0, 1,
    'WITHSCORES')
  if head.err or not head[2] then return nil end
  if not flow_rate_stepped(prefix, head, now) then
    local last = redis.call('ZRANGE', rh, -1, -1, 'WITHSCORES')
    if last[1] == head[1] or not flow_rate_stepped(prefix, last, now) then return nil end
  end
  return redis.call('ZRANGE', rh, '(' .. fmt(now), '+inf', 'BYSCORE', 'LIMIT', 0, room,
    'WITHSCORES')
end

-- Rate-held jobs whose slot has come go back into due, earliest slot first, up to as many as
-- one claim may set aside (the rest keep their passed slot for the next claims: a worker's
-- next claim is then at once), but no more of one key than its window
-- has room for, picked in claim's order (aged by run_at, then priority, then run_at); each of
-- the key's others gets the slot at which the window has room for it, in that order (one
-- window on for those behind the starts sent back now). Before, a window's worth of
-- set-asides came back every window at their old run_at, filled claim's budget ahead of the
-- plain jobs due after them and were set aside again (a 20,000 backlog at 10/200ms starved
-- every plain job and held Redis at 99% CPU). A job set aside again gets a later slot, so none
-- waits for ever. flow:rheld of another type (written by hand) reads as empty; a job whose rate
-- fields cannot be read goes back into due, where claim sees to it.
--
-- A slot is never later than a start + the job's window, and a start never later than the
-- claim's now: a slot later than now + its window was written by a clock that has since stepped
-- back. Such an entry is taken as if its slot had come (flow_rate_ahead), so its key holds it
-- one window from now, not for the step (a day's step held it the day while the key's newer
-- jobs ran). A job whose run_at is later than now was set aside by such a clock, due then: it
-- goes first, back into due at now (at its run_at it would wait the step again).
local function flow_rate_due(prefix, now, limit)
  local rh = prefix .. 'flow:rheld'
  local max = flow_moved_max(limit)
  local ids = redis.pcall('ZRANGE', rh, '-inf', now, 'BYSCORE', 'LIMIT', 0, max)
  if ids.err then return end
  local slots = {}  -- a stepped entry's slot (its slot has not come)
  local ahead = flow_rate_ahead(prefix, rh, now, max - #ids)
  for k = 1, ahead and #ahead or 0, 2 do
    ids[#ids + 1], slots[ahead[k]] = ahead[k], tonumber(ahead[k + 1])
  end
  local function back(id, run_at)
    if tonumber(run_at) and tonumber(run_at) > now then run_at = fmt(now) end
    if flow_unhold(prefix, id, run_at) then redis.call('ZREM', rh, id) end
  end
  local by_key, keys = {}, {}
  for i, id in ipairs(ids) do
    local v = redis.pcall('HMGET', job_key(prefix, id), unpack(FLOW_READ))
    local f = (not v.err) and flow_from(v, 1)
    local run_at = redis.pcall('ZSCORE', prefix .. 'flow:held', id)
    if type(run_at) ~= 'string' then run_at = fmt(now) end
    local t = tonumber(run_at) or now
    -- An entry taken but not stepped (its slot is within its window from now) keeps its slot.
    if not slots[id] or (f and f.rwindow > 0 and slots[id] > now + f.rwindow) then
      if f and f.rkey ~= '' and f.rcount > 0 and f.rwindow > 0 then
        local jobs = by_key[f.rkey]
        if not jobs then
          jobs = {}
          by_key[f.rkey], keys[#keys + 1] = jobs, f.rkey
        end
        jobs[#jobs + 1] = { id = id, run_at = run_at, t = math.min(t, now), ahead = t > now,
          i = i, f = f }
      else
        back(id, run_at)
      end
    end
  end
  if #keys == 0 then return end
  local aged_at = now - flow_aging(prefix)
  local function first(a, b)
    if a.ahead ~= b.ahead then return a.ahead end
    local aa, ab = a.t <= aged_at, b.t <= aged_at
    if aa ~= ab then return aa end
    if not aa and a.f.priority ~= b.f.priority then return a.f.priority > b.f.priority end
    if a.t ~= b.t then return a.t < b.t end
    return a.i < b.i
  end
  -- A job whose concurrency key is full (with the ones sent back before it) goes back without
  -- taking room: claim holds it by its key, and the room is left to a job that can start (it
  -- was given to a job claim then held by key, and a job of another key waited a window more).
  local ck_room = {}
  local function key_full(j)
    local f = j.f
    if f.ckey == '' then return false end
    local room = ck_room[f.ckey]
    if room == nil then
      local live = flow_ck_live(prefix, f.ckey, now)
      room = live and (f.climit - live) or f.climit  -- a set of another type: claim parks it
    end
    ck_room[f.ckey] = room - 1
    -- Room for its limit, but a job of its key is held ahead of it: claim holds it behind.
    return room <= 0 or flow_ck_ahead(prefix, f.ckey, j.id,
      flow_ck_score(prefix, j.t, f.priority)) ~= nil
  end
  -- A job past its start deadline (its spec's, or a schedule run's start_by_ms) goes back
  -- without taking room as well: claim parks it, nothing starts.
  local function past_start(j)
    -- The flags sit before the payload: the record's head (GETRANGE, as job_spec's), read
    -- whole only when a field edited by hand makes the head longer than that.
    local sk = spec_key(prefix, j.id)
    local text = redis.pcall('GETRANGE', sk, '0', '1023')
    if type(text) == 'string' and #text == 1024
        and not string.find(text, '^2|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|') then
      text = redis.pcall('GET', sk)
    end
    local ms = type(text) == 'string' and select(3, string.match(text, SPEC_FLAGS_RE))
    ms = ms and parse_int(ms, 0, LIM.time_ms)
    if not ms then
      ms = redis.pcall('HGET', job_key(prefix, j.id), 'start_by_ms')
      ms = type(ms) == 'string' and parse_int(ms, 0, LIM.time_ms)
    end
    return ms and now > ms or false
  end
  for _, key in ipairs(keys) do
    local jobs, starts, went, rk = by_key[key], {}, 0, prefix .. 'flow:rate:' .. key
    local later = 0  -- the key's jobs given a later slot so far
    table.sort(jobs, first)
    for _, j in ipairs(jobs) do
      local w = j.f.rwindow
      if starts[w] == nil then
        flow_rate_clamp(rk, now)
        local n = redis.pcall('ZCOUNT', rk, '(' .. fmt(now - w), '+inf')
        starts[w] = type(n) == 'number' and n or 0  -- a log of another type: claim parks it
      end
      if starts[w] + went < j.f.rcount and (past_start(j) or key_full(j)) then
        back(j.id, j.run_at)
      elseif starts[w] + went < j.f.rcount then
        went = went + 1
        back(j.id, j.run_at)
      else
        -- Its slot: when the window has room for it, behind the ones sent back now (they
        -- start now) and the key's others given a slot before it: the k-th latest start of the
        -- log leaves the window then; none that late inside it: one window on (it waits for the
        -- starts of now). Before, all of them waited one window on, though the window's older
        -- starts left it sooner (tests/test_flow_rate_lateness.py).
        local k, slot = j.f.rcount - went - later, now + w
        if k >= 1 then
          local s = redis.pcall('ZRANGE', rk, -k, -k, 'WITHSCORES')
          s = type(s) == 'table' and flow_rate_at(s[2], now)
          if s and s > now - w then slot = math.floor(s) + w end
        end
        later = later + 1
        redis.call('ZADD', rh, slot, j.id)
        -- Its reason names the new slot (it named the one that passed). pcall: advisory.
        redis.pcall('HSET', job_key(prefix, j.id), 'flow_reason', flow_rate_reason(j.f, slot))
      end
    end
  end
end

-- The earliest rate slot, or nil: part of claim's next_ms, so a worker sleeps until then
-- (flow:rheld of another type, an error reply, has no h[2]: nil).
local function flow_next_slot(prefix)
  local h = redis.pcall('ZRANGE', prefix .. 'flow:rheld', 0, 0, 'WITHSCORES')
  if h[2] then return math.max(0, math.min(math.floor(tonumber(h[2]) or 0), LIM.time_ms)) end
  return nil
end

-- A job leaves every flow set (cancel): out of its priority index, the holds and the key's
-- leases (pcall: a set of another type, written by hand, must not make cancel raise after its
-- first write).
local function flow_forget(prefix, id, now, f)
  f = f or flow_load(job_key(prefix, id))
  flow_unindex(prefix, id, f.priority)
  redis.pcall('ZREM', prefix .. 'flow:held', id)
  redis.pcall('ZREM', prefix .. 'flow:rheld', id)
  redis.pcall('ZREM', prefix .. 'flow:waiting', id)
  if f.ckey ~= '' or f.ckey_lost then
    redis.pcall('ZREM', prefix .. 'flow:ckheld:' .. (f.ckey_lost or f.ckey), id)
    flow_release(prefix, id, now, f)
  end
end

-- The priority levels in flow:levels, highest first. The set is advisory: a member that is no
-- level's canonical text (written by hand) is dropped from it, and a key of another type reads
-- as no level (claim is FIFO), rather than raise after the reaper's writes on every claim.
local function flow_levels(prefix)
  local key = prefix .. 'flow:levels'
  local raw = redis.pcall('SMEMBERS', key)
  if raw.err then return {} end
  local levels = {}
  for _, p in ipairs(raw) do
    local n = parse_int(p, 1, FLOW_LIM.priority)
    if n and fmt(n) == p then levels[#levels + 1] = n else redis.call('SREM', key, p) end
  end
  table.sort(levels, function(a, b) return a > b end)
  return levels
end

-- Fill a claim batch in flow order: aged jobs FIFO, then each priority level high to low, then
-- the rest of due FIFO (docs/flow-control.md). `examine(id, due_score)` leases ('took'), sets
-- aside ('held') or parks/drops ('gone') one candidate; ids it takes stay in due until claim's
-- end. Without priority levels this is the plain FIFO scan (one ZRANGE), with one more round
-- only after a candidate was not taken. 'skip' (a suspect this worker may not take: claim.lua)
-- leaves it in due: the due window is widened by as many.
local function flow_fill(prefix, due, now, limit, examine)
  local seen, took, aside, skipped, budget = {}, 0, 0, 0, limit + FLOW_HOLD_BUDGET
  -- Set aside or parked (a skip stays in due, unwritten): bounded apart from the batch.
  local moved_max = flow_moved_max(limit)
  local function more() return took < limit and budget > 0 and aside - skipped < moved_max end
  local function one(src, in_due, id, s)
    seen[id] = true
    budget = budget - 1
    if not in_due then
      redis.call('ZREM', src, id)
      -- A stale index entry (the job left due, or is due later): dropped, nothing else.
      if s == false or tonumber(s) > now then return 'stale' end
    end
    local v = examine(id, s)
    if v == 'took' then took = took + 1 else aside = aside + 1 end
    if v == 'skip' then skipped = skipped + 1 end
    return v
  end
  local function pass(src, hi, in_due)
    while more() do
      -- Seen ids may still be in src: in due, those taken (they leave due at claim's end); in
      -- an index also those the aged pass set aside or parked (an entry is dropped only when
      -- a scan of its own index meets it). The window is widened by as many, so they never
      -- hide the level's other jobs.
      local want = in_due and limit + skipped or limit + aside
      local fresh, again = 0, false
      local ids
      if in_due then
        ids = redis.call('ZRANGE', src, '-inf', hi, 'BYSCORE', 'LIMIT', 0, want, 'WITHSCORES')
      else
        -- An index of another type (written by hand) reads as empty: due still has its jobs.
        ids = redis.pcall('ZRANGE', src, '-inf', hi, 'BYSCORE', 'LIMIT', 0, want)
        if ids.err then return end
      end
      local step = in_due and 2 or 1
      for k = 1, #ids, step do
        if not more() then break end
        local id = ids[k]
        if not seen[id] then
          fresh = fresh + 1
          local s = in_due and ids[k + 1] or redis.call('ZSCORE', due, id)
          -- Anything not taken (set aside, parked, a stale entry dropped) may leave room the
          -- window did not show, or promote a key's held job into due: another round.
          if one(src, in_due, id, s) ~= 'took' then again = true end
        end
      end
      -- A round that meets nothing new ends the pass.
      if not again or fresh == 0 then return end
    end
  end
  local levels = flow_levels(prefix)
  if #levels == 0 then
    pass(due, now, true)
    return
  end
  pass(due, now - flow_aging(prefix), true)
  for _, p in ipairs(levels) do
    local src = prefix .. 'flow:pdue:' .. fmt(p)
    pass(src, now, false)
    if redis.call('EXISTS', src) == 0 then redis.call('SREM', prefix .. 'flow:levels', fmt(p)) end
  end
  pass(due, now, true)
end

-- Dependencies (enqueue after=[ids]). A waiting job is due-but-held: in flow:held and
-- flow:waiting (id -> run_at_ms), not in due, with `waiting_for` (parents not done yet),
-- `parents` (the ids it was set waiting for, space-separated) and the reason; each parent not
-- done lists it in flow:children:<parent> and carries `kids` = '1' (so complete finds children
-- without an extra read on the plain path).

-- Is `id` taken by a queue move (in `moving`: scheduler queue move, move_out.lua)? Its
-- record here is deleted by the move's last step (move_done.lua) and it ends in the other
-- queue: a child waiting for it here would wait for ever, so none is set waiting for it
-- (enqueue and requeue_dead refuse, BAD_ARGUMENT, before any write). `moving` of another type
-- (edited by hand) holds no move: read as not taken.
local function flow_moving(prefix, id)
  return type(redis.pcall('ZSCORE', prefix .. 'moving', id)) == 'string'
end

-- Where each parent stands, checked before enqueue writes anything: a list of
-- {id, 'done' | 'pending' | 'dead' | 'cancelled'}, one per distinct parent, or nil and the
-- error reply. `batch` holds the ids enqueued earlier in the same call (pending); `alias` maps
-- an earlier id of the call whose idempotency key was taken to the job the key names.
local function flow_parents(prefix, after, batch, alias)
  local out, seen = {}, {}
  for _, named in ipairs(after) do
    local pid = alias[named] or named
    if not seen[pid] then
      seen[pid] = true
      local state = redis.pcall('HGET', job_key(prefix, pid), 'state')
      if type(state) == 'table' then  -- flow_wait would write its `kids` field
        local jk = job_key(prefix, pid)
        local name = string.sub(jk, #prefix + 1)
        return nil, key_type_err(jk, name, 'hash')
          or corrupt_err(name, 'hash')
      end
      if not state and (batch[pid] or redis.call('EXISTS', spec_key(prefix, pid)) == 1) then
        state = 'pending'
      end
      if state == 'due' or state == 'leased' then state = 'pending' end
      local via = pid ~= named and (' (its idempotency key names ' .. pid .. ')') or ''
      if state ~= 'done' and state ~= 'pending' and state ~= 'dead' and state ~= 'cancelled' then
        return nil, redis.error_reply('BAD_ARGUMENT after=' .. named .. via .. ' (no such job)')
      end
      if state == 'pending' and flow_moving(prefix, pid) then
        return nil, redis.error_reply('BAD_ARGUMENT after=' .. named .. via
          .. ' (being moved to another queue)')
      end
      out[#out + 1] = { pid, state }
      -- The keys flow_wait may write, checked before enqueue's first write.
      local bad = state == 'pending' and key_type_err(prefix .. 'flow:children:' .. pid,
        'flow:children:' .. pid, 'set')
      if bad then return nil, bad end
    end
  end
  local bad = zset_err(prefix, 'flow:held') or zset_err(prefix, 'flow:waiting') or dead_err(prefix)
  if bad then return nil, bad end
  return out
end

-- A new job with parents: parked at once when one already ended dead or cancelled (returns
-- true), set waiting when some are not done (returns true), else false (due as usual).
local function flow_wait(prefix, id, jk, run_at, parents, now)
  local pending, open = {}, {}
  for _, pr in ipairs(parents) do
    if pr[2] ~= 'done' then open[#open + 1] = pr[1] end
  end
  for _, pr in ipairs(parents) do
    if pr[2] == 'pending' then
      -- A parent earlier in this batch may have been parked at once since the parents check read
      -- it (its own parent dead): re-read, or this child would wait for it forever. Parked and
      -- deleted at once by the dead retention (lib/job.lua dead_trim: max_count 0, a same-ms
      -- tie), it has neither hash nor spec left: dead too, and nothing is written into its
      -- keys (a `kids` field would re-create a hash of one field, no expiry, the id blocked).
      local st = redis.pcall('HGET', job_key(prefix, pr[1]), 'state')
      if type(st) == 'table' then st = nil end
      if not st and not job_exists(prefix, pr[1]) then st = 'dead' end
      if st == 'dead' or st == 'cancelled' then pr = { pr[1], st } end
    end
    if pr[2] == 'dead' or pr[2] == 'cancelled' then
      -- `parents` stays with the parked child: requeue_dead waits again for those still
      -- pending then (flow_rewait), instead of running it beside them.
      redis.call('HSET', jk, 'parents', table.concat(open, ' '))
      pin_unclaimed(prefix, id, jk, fmt(run_at))
      dead_letter(prefix, id, 'parent ' .. pr[2] .. ': ' .. pr[1], now)
      bump_stat(prefix, now, 'dead', 1)  -- a new dead job, counted as fail's park counts one
      return true
    end
    if pr[2] == 'pending' then pending[#pending + 1] = pr[1] end
  end
  if #pending == 0 then return false end
  for _, pid in ipairs(pending) do
    redis.call('SADD', prefix .. 'flow:children:' .. pid, id)
    redis.call('HSET', job_key(prefix, pid), 'kids', '1')
  end
  redis.call('ZADD', prefix .. 'flow:held', run_at, id)
  redis.call('ZADD', prefix .. 'flow:waiting', run_at, id)
  redis.call('HSET', jk, 'waiting_for', fmt(#pending), 'flow_reason',
    'waiting for ' .. fmt(#pending) .. ' jobs', 'parents', table.concat(pending, ' '))
  return true
end

-- Does the waiting child whose `parents` field is `listed` (HGET/HMGET value) wait for `pid`?
-- A child that left its wait another way (parked by another parent, cancelled) stays in its
-- other parents' flow:children sets until they end, and once its record is gone (purged,
-- trimmed, expired) its id may be enqueued again to wait for other jobs: a parent's end counts
-- only for a child that lists it. Checked here, where a parent ends, not by cleaning every
-- parent's set when a child leaves: one field more in a read the parent's end makes anyway,
-- and it covers every way out (none of them, nor the plain path, pays for it). A child of an
-- older version (no field), or one whose field is no list of ids (edited by hand, an error
-- reply), is taken as listed: the set is trusted, as before.
local function flow_lists(listed, pid)
  if type(listed) ~= 'string' or not string.find(listed, '^[%w_.:%- ]+$') then return true end
  return string.find(' ' .. listed .. ' ', ' ' .. pid .. ' ', 1, true) ~= nil
end

-- A parent's end reaches at most FLOW_END_STEP of its waiting children per script (about 20 us
-- each: a parent of 100k children would hold the server for 2 s, every client waiting). The
-- rest go to that end's own set (flow_end_step_done), and the end to `flow:ending` (ZSET
-- '<word>:<parent id>' -> when queued; word: done | dead | cancelled); the next claims go on
-- with them (flow_ending_step), each waking an idle worker while any is left. Per script.
local FLOW_END_STEP = 300
local flow_end_left = FLOW_END_STEP

-- Up to the script's budget of a parent's waiting children, taken off its set (SPOP: the rest
-- stay for a later step). None when the key was made another type by hand (the callers DEL
-- it after), rather than an error after the script's first write.
local function flow_take_children(ck)
  if flow_end_left <= 0 then return {} end
  local ids = redis.pcall('SPOP', ck, flow_end_left)
  if type(ids) ~= 'table' or ids.err then return {} end
  flow_end_left = flow_end_left - #ids
  return ids
end

-- After a step of parent `pid`'s end over the set `ck`: are children left for a later step?
-- Then they go to that end's own set `flow:ending:<word>:<pid>` (RENAME; merged into it when an
-- earlier end of the same id is still going) and the end is queued in flow:ending: the id's
-- own flow:children set starts empty, so a job that takes the id again (its record expired,
-- or it was requeued from dead) and children enqueued after it are never reached by this end.
-- Else the end's entry goes (`ck` was that end's set) and so does the set (an empty one, or one
-- of another type, by hand, no step could read). Advisory writes: a key of another type leaves
-- children waiting (doctor: stuck-waiting), never raises after the script's first write.
local function flow_end_step_done(prefix, word, pid, ck, now)
  local endk = prefix .. 'flow:ending:' .. word .. ':' .. pid
  local n = redis.pcall('SCARD', ck)
  if type(n) == 'number' and n > 0 then
    if ck ~= endk then
      if redis.call('EXISTS', endk) == 1 then
        redis.pcall('SUNIONSTORE', endk, endk, ck)
        redis.call('DEL', ck)
      else
        redis.pcall('RENAME', ck, endk)
      end
    end
    redis.pcall('ZADD', prefix .. 'flow:ending', 'NX', now, word .. ':' .. pid)
    return true
  end
  if ck == endk then redis.pcall('ZREM', prefix .. 'flow:ending', word .. ':' .. pid) end
  redis.call('DEL', ck)
  return false
end

-- A parent is done: each waiting child that lists it (flow_lists) counts it; one with no
-- parent left is due at max(its own run_at, now) (never early), its run_at_ms so written. Reached from complete after its first
-- write (leased ZREMed), so no hand-edited child may make it raise (Redis keeps the partial
-- writes: the parent, and every later job of the call, would be left in neither leased nor
-- due): the count is read with the strict reader and written back with HSET (no HINCRBY, which
-- errors on a non-integer), and a child key of another type is skipped (left waiting and held,
-- for doctor: it cannot take the hash fields flow_unhold writes).
local function flow_parent_done(prefix, id, now, endk)
  local ck = endk or (prefix .. 'flow:children:' .. id)
  local freed = false
  for _, cid in ipairs(flow_take_children(ck)) do
    -- flow:waiting of another type (edited by hand): the child's place in flow:held says it
    -- still waits, and its score is the same run_at.
    local run_at = redis.pcall('ZSCORE', prefix .. 'flow:waiting', cid)
    if type(run_at) == 'table' then run_at = redis.pcall('ZSCORE', prefix .. 'flow:held', cid) end
    if type(run_at) ~= 'string' then run_at = false end
    local cjk = job_key(prefix, cid)
    local v = run_at and redis.pcall('HMGET', cjk, 'waiting_for', 'parents')
    if run_at and not v.err and flow_lists(v[2], id) then
      -- An unreadable count (edited by hand, or gone) counts as this parent alone, so the child
      -- becomes due now: no parent's end could ever bring a count nobody can read to 0 (the
      -- count is not rebuilt from `parents`, which does not say which are done, and doctor
      -- does not recount), and a child run early is the lesser harm than one waiting forever.
      local left = (parse_int(v[1], 1, FLOW_LIM.after) or 1) - 1
      if left <= 0 then
        -- Due from now, or from its own later run_at (never early): at its enqueue-time run_at
        -- it counted as overdue by its parents' whole run, so claim's aged pass served it
        -- ahead of every priority and the start lateness (stats, counts' oldest due) reported
        -- a queue behind while it started the moment it could.
        local at = math.max(tonumber(run_at) or now, now)
        if flow_unhold(prefix, cid, fmt(at)) then
          redis.pcall('ZREM', prefix .. 'flow:waiting', cid)
          redis.call('HDEL', cjk, 'waiting_for', 'parents')
          if at > (tonumber(run_at) or now) then
            -- A never-claimed job's run_at_ms is its due score, and a blank enqueued_ms in its
            -- spec reads as that score too: pinned to the old one. A hash that holds run_at_ms
            -- (a requeued job's, an older version's) gets the new one.
            spec_pin_enqueued(prefix, cid, run_at)
            if redis.call('HEXISTS', cjk, 'run_at_ms') == 1 then
              redis.call('HSET', cjk, 'run_at_ms', fmt(at))
            end
          end
          freed = true
        end
      else
        redis.call('HSET', cjk, 'waiting_for', fmt(left), 'flow_reason',
          'waiting for ' .. fmt(left) .. ' jobs')
      end
    end
  end
  flow_end_step_done(prefix, 'done', id, ck, now)
  -- Its own set is handled or handed to its end: the mark goes (not in a later step, whose id
  -- may be another job's by then).
  if not endk then redis.pcall('HDEL', job_key(prefix, id), 'kids') end
  -- An idle worker may be sleeping until the parent's lease end: a child is due again.
  if freed then wake(prefix .. 'wake') end
end

-- A parent ended dead or cancelled (`word`): its waiting children (those that list it:
-- flow_lists) are parked with the reason, and theirs in turn ('parent dead: <child>'), the
-- subtree within the script's budget (FLOW_END_STEP; the rest in later steps). Reached after
-- the callers' first writes (fail, cancel, claim's reaper and parks): a child key of another
-- type is parked by its id alone, as claim parks a key that is not a hash, instead of raising
-- on its hash writes.
local function flow_parent_ended(prefix, id, word, now, endk)
  local work = { { id, word, endk } }
  local i = 1
  local parked = 0
  while work[i] do
    local pid, why = work[i][1], work[i][2]
    local ck = work[i][3] or (prefix .. 'flow:children:' .. pid)
    i = i + 1
    for _, cid in ipairs(flow_take_children(ck)) do
      -- flow:waiting of another type (edited by hand): a child still waits when its hash has
      -- the count (every way out of the wait deletes it).
      local v = redis.pcall('HMGET', job_key(prefix, cid), 'parents', 'waiting_for')
      local listed = v.err and v or v[1]
      local w = flow_lists(listed, pid) and redis.pcall('ZREM', prefix .. 'flow:waiting', cid)
      if w == 1 or (type(w) == 'table' and not v.err and v[2]) then
        -- Its run time, while it waited: its score in flow:held (flow_wait), written down.
        local at = redis.pcall('ZSCORE', prefix .. 'flow:held', cid)
        redis.pcall('ZREM', prefix .. 'flow:held', cid)
        -- `parents` stays for requeue_dead (flow_rewait); flow_lists ignores a child that
        -- waits no more (not in flow:waiting, no count).
        local r = redis.pcall('HDEL', job_key(prefix, cid), 'waiting_for', 'flow_reason')
        if type(r) == 'table' then
          dead_letter_id(prefix, cid, now)
        else
          if type(at) == 'string' then pin_unclaimed(prefix, cid, job_key(prefix, cid), fmt(tonumber(at))) end
          dead_letter(prefix, cid, 'parent ' .. why .. ': ' .. pid, now)
        end
        -- A parked child's result waiters learn it now, not at their next re-read.
        result_wake(prefix, cid, 'dead', RESULT_WAKE_DEAD_TTL_MS)
        work[#work + 1] = { cid, 'dead' }
        parked = parked + 1
      end
    end
    flow_end_step_done(prefix, why, pid, ck, now)
  end
  -- Each child parked is a new dead job in the per-minute counts (stats' dead column).
  if parked > 0 then bump_stat(prefix, now, 'dead', parked) end
end

-- The next steps of parents' ends left for later (flow_parent_done / _ended), within this
-- script's budget, oldest first; claim runs it. Pages of 10 entries are read while the budget
-- lasts (one page of 10 was the whole step: a dead parent's subtree of one-child chains, an
-- entry per child, was parked 10 jobs a claim), at most FLOW_END_STEP entries in all (one whose
-- set is already empty costs no budget). An entry whose step ends with its set empty leaves
-- the index, so each page is read from its head. While any is left an idle worker is woken,
-- so the steps go on at once, each bounded. An entry this version does not write (by hand) goes.
local function flow_ending_step(prefix, now)
  local k = prefix .. 'flow:ending'
  local examined = 0
  while flow_end_left > 0 and examined < FLOW_END_STEP do
    local entries = redis.pcall('ZRANGE', k, 0, math.min(9, FLOW_END_STEP - examined - 1))
    if type(entries) ~= 'table' or entries.err or #entries == 0 then break end
    for _, e in ipairs(entries) do
      if flow_end_left <= 0 then break end
      examined = examined + 1
      local word, pid = string.match(e, '^(%a+):(.+)$')
      if word == 'done' then
        flow_parent_done(prefix, pid, now, prefix .. 'flow:ending:' .. e)
      elseif word == 'dead' or word == 'cancelled' then
        flow_parent_ended(prefix, pid, word, now, prefix .. 'flow:ending:' .. e)
      else
        redis.call('ZREM', k, e)
      end
    end
  end
  local left = redis.pcall('ZCARD', k)  -- of another type (by hand): no step, no wake-up
  if type(left) == 'number' and left > 0 then wake(prefix .. 'wake') end
end

-- A parked child's `parents` field (HMGET value) read before requeue_dead writes: how many
-- parents flow_rewait would read and link it to (0 for a field it ignores), and the first of
-- them a queue move has taken (in `moving`), or nil.
local function flow_rewait_links(prefix, listed)
  if type(listed) ~= 'string' or not string.find(listed, '^[%w_.:%- ]+$') then return 0, nil end
  local n, taken = 0, nil
  for pid in string.gmatch(listed, '%S+') do
    n = n + 1
    if not taken and flow_moving(prefix, pid) then taken = pid end
  end
  return n, taken
end

-- A parked child being requeued (requeue_dead, after every job of the call is back to state
-- 'due'): set waiting again for the parents it lists that are still pending (waiting, due or
-- leased: one requeued by the same call too), so it never runs beside them; a parent that
-- ended dead or cancelled, or is gone, is not waited for (the operator runs the child anyway).
-- True when it waits. A parent's flow:children key of another type (edited by hand) is not
-- waited for either: the child runs rather than waiting on a key no end would read.
local function flow_rewait(prefix, id, jk, now)
  local listed = redis.pcall('HGET', jk, 'parents')
  redis.pcall('HDEL', jk, 'parents')
  if type(listed) ~= 'string' or not string.find(listed, '^[%w_.:%- ]+$') then return false end
  local pending = {}
  for pid in string.gmatch(listed, '%S+') do
    local st = redis.pcall('HGET', job_key(prefix, pid), 'state')
    if type(st) == 'table' then st = 'unreadable' end
    if not st and redis.call('EXISTS', spec_key(prefix, pid)) == 1 then st = 'due' end
    if (st == 'due' or st == 'leased') and #pending < FLOW_LIM.after
        and not key_type_err(prefix .. 'flow:children:' .. pid, 'flow:children:' .. pid, 'set')
    then
      pending[#pending + 1] = { pid, 'pending' }
    end
  end
  return #pending > 0 and flow_wait(prefix, id, jk, now, pending, now)
end
