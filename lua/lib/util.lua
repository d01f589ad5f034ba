-- Exact integer formatting: tostring() switches to exponent notation past 14 digits.
local function fmt(n)
  return string.format('%.0f', n)
end

-- Valid ranges: a copy of scheduler/codec.py LIMITS (tests/test_hostile_data.py checks they agree).
local LIM = {
  time_ms = 7258118400000,      -- run_at_ms and every stored instant: 1970 .. 2200-01-01 UTC
  delay_ms = 315360000000,      -- delays, backoff base/cap, every_ms, jitter: 0 .. 3650 days
  attempts = 1000000,           -- attempts and max_attempts
  timeout_ms = 604800000,       -- a handler's timeout: 0 (none) .. 7 days
  lease_ms = 86400000,          -- 1 ms .. 1 day
  ttl_ms = 31622400000,         -- result / record / idempotency TTLs: 1 ms .. 366 days
  limit = 1000,                 -- jobs per claim
  reap_limit = 10000,           -- lapsed leases reaped per claim
  factor = 1000,                -- backoff factor: 1 .. 1000
  fence = 9007199254740991,     -- 2^53 - 1: the largest integer a Lua number holds exactly
}

-- A partitioned queue's own name holds only its layout record `partitions`
-- (scheduler/core/partitions.py meta_key): a job or a schedule written under that name would
-- wait where no worker looks (workers serve its partitions). nil, or the refusal.
local function partitioned_err(prefix)
  if redis.call('EXISTS', prefix .. 'partitions') == 0 then return nil end
  local name = string.match(prefix, '^sched:{(.*)}:$') or prefix
  return redis.error_reply('BAD_ARGUMENT queue=' .. string.sub(name, 1, 80) .. ' is partitioned:'
    .. ' open it with scheduler.open_queue (a plain Queue would write where no worker looks)')
end

-- For a check before a script's first write (Redis keeps the writes made before an error): a
-- 'CORRUPT <name> is not a <want> (nothing written)' error reply (a typed CorruptKey in
-- Python) when `key` (`name`: after the prefix) holds another type (edited by hand), else nil.
-- A read of that type, not TYPE: the app ACL role has no TYPE (docs/security.md).
local function corrupt_err(name, want)
  return redis.error_reply('CORRUPT ' .. name .. ' is not a ' .. want .. ' (nothing written)')
end
-- A pcall'd first write's error reply `r` (nil when it is not one): CORRUPT for WRONGTYPE (a key
-- edited by hand), else the server's own refusal as it came (OOM, READONLY, NOREPLICAS, MISCONF:
-- nothing written, and the caller must see why; they are not a corrupt key).
local function write_refused(r, name, want)
  if type(r) ~= 'table' or not r.err then return nil end
  if string.find(r.err, '^WRONGTYPE') then return corrupt_err(name, want) end
  return r
end
local KEY_PROBE = { zset = 'ZCARD', set = 'SCARD' }
local function key_type_err(key, name, want)
  local r
  if want == 'hash' then
    r = redis.pcall('HGET', key, 'state')
  else
    r = redis.pcall(KEY_PROBE[want], key)
  end
  if type(r) ~= 'table' then return nil end
  return corrupt_err(name, want)
end

-- The one strict integer reader for ARGV and stored fields: optional '-' and decimal digits only
-- (tonumber would also take hex, exponents, 'inf', 'nan' and fractions), within [lo, hi].
local function parse_int(v, lo, hi)
  if type(v) ~= 'string' or #v > 17 or not string.find(v, '^%-?%d+$') then return nil end
  local n = tonumber(v)
  if n > LIM.fence or n < -LIM.fence then return nil end
  if (lo ~= nil and n < lo) or (hi ~= nil and n > hi) then return nil end
  return n
end

-- The storage generation this code reads and writes. A later version whose stored layout this
-- one would misread sets the queue's `config` field `generation` to its own, higher number;
-- every script that changes state calls this first and is refused, nothing written, instead
-- of corrupting (docs/guide/workers.md "Upgrading"). A field that is not such a number (edited
-- by hand) is not a generation: it refuses nothing (doctor names it).
local STORAGE_GENERATION = 1
local function newer_storage_err(prefix)
  local g = redis.pcall('HGET', prefix .. 'config', 'generation')
  -- At most 7 characters, as the Python readers (worker start, doctor) take it: '00000002'
  -- refused here but started on by `scheduler worker` left it claiming nothing, for good.
  if type(g) ~= 'string' or #g > 7 then return nil end
  local n = parse_int(g, STORAGE_GENERATION + 1, 1000000)
  if n == nil then return nil end
  return redis.error_reply('NEWER_STORAGE generation=' .. g .. ' (this version reads '
    .. STORAGE_GENERATION .. ')')
end

-- A plain decimal (Python's float repr: '2.0', '0.25', '1e-05'); no hex, 'inf' or 'nan'.
local function parse_num(v, lo, hi)
  if type(v) ~= 'string' or #v > 32 then return nil end
  if not (string.find(v, '^%d+%.?%d*$') or string.find(v, '^%d+%.?%d*[eE][-+]?%d+$')) then
    return nil
  end
  local n = tonumber(v)
  if n == nil or n ~= n or n < lo or n > hi then return nil end
  return n
end

-- 'base_ms,factor,cap_ms,jitter' as the client sends and the job hash stores it; nil if invalid.
local function parse_backoff(text)
  if type(text) ~= 'string' then return nil end
  local _, _, b, f, c, j = string.find(text, '^([^,]+),([^,]+),([^,]+),([^,]+)$')
  b, f = parse_int(b, 0, LIM.delay_ms), parse_num(f, 1, LIM.factor)
  c, j = parse_int(c, 0, LIM.delay_ms), parse_num(j, 0, 1)
  if b == nil or f == nil or c == nil or j == nil then return nil end
  return { b, f, c, j }
end

-- The name rules of scheduler/codec.py (task), scheduler/keys.py (job id) and
-- scheduler/recurring.py (schedule).
local function task_ok(v)
  return type(v) == 'string' and #v >= 1 and #v <= 200 and string.find(v, '^[%w_.:/%-]+$') ~= nil
end
-- Not '.' or '..' (scheduler/core/keys.py check_new_job_id: a page cannot be linked to).
local function job_id_ok(v)
  return type(v) == 'string' and #v >= 1 and #v <= 128 and string.find(v, '^[%w_.:%-]+$') ~= nil
    and v ~= '.' and v ~= '..'
end
local function schedule_name_ok(v)
  return type(v) == 'string' and #v >= 1 and #v <= 64 and string.find(v, '^[%w_.%-]+$') ~= nil
end

-- Every ARGV number is checked before the first write (Redis keeps writes made before an error).
local function int_arg(v, name, min, max)
  local n = parse_int(v, min, max)
  if n == nil then
    return nil, redis.error_reply('BAD_ARGUMENT ' .. name .. '=' .. string.sub(tostring(v), 1, 40))
  end
  return n
end

-- ARGV[from..] as integers within [min, max], checked together before any write.
local function int_args(from, name, min, max)
  local out = {}
  for i = from, #ARGV do
    local v, err = int_arg(ARGV[i], name, min, max)
    if err then return nil, err end
    out[#out + 1] = v
  end
  return out
end

-- `cmd key unpack(args)` in slices: unpack has a C-stack limit (~8000 values) that a large batch
-- would pass half-way through a script. `step` values per call (even for score-member pairs).
local UNPACK_STEP = 1000
local function call_chunked(cmd, key, args)
  for i = 1, #args, UNPACK_STEP do
    redis.call(cmd, key, unpack(args, i, math.min(i + UNPACK_STEP - 1, #args)))
  end
end

-- Per-minute outcome counters, read by `scheduler stats`; kept two hours. pcall: they are
-- advisory, and a hand-written non-integer counter (or a key of another type) must not fail a
-- transition after its writes.
local function bump_stat(prefix, now, field, n)
  if n <= 0 then return end
  local k = prefix .. 'stats:' .. fmt(math.floor(now / 60000))
  redis.pcall('HINCRBY', k, field, n)
  redis.pcall('PEXPIRE', k, 7200000)
end

-- Tell idle workers something became due earlier than they planned; the list stays tiny.
-- Advisory too (workers also poll), hence pcall.
local function wake(wake_key)
  -- Advisory: a key of another type (a hand edit; it fails every worker's wake-up pop) is
  -- replaced, not written around.
  local r = redis.pcall('LPUSH', wake_key, '1')
  if type(r) == 'table' and string.find(tostring(r.err), '^WRONGTYPE') then
    redis.call('DEL', wake_key)
    redis.call('LPUSH', wake_key, '1')
  end
  redis.pcall('LTRIM', wake_key, 0, 7)
end

-- SCARD that reads a key of another type as empty (the advisory refill flag of claim).
local function scard_or_0(key)
  local c = redis.pcall('SCARD', key)
  if type(c) ~= 'number' then return 0 end
  return c
end

-- The run lock of `scheduler queue move` (`move_lock` built from the prefix,
-- scheduler/admin/queue_move_lock.py): nil while its JSON value names `token` or, for '', while
-- no lock is there; else the MOVE_LOCKED error reply naming the holder (nothing written). A run
-- that lost its lock (paused past its lease) writes nothing more through move_out / move_done.
local function move_lock_err(prefix, token)
  local held = redis.pcall('GET', prefix .. 'move_lock')
  local owner = nil
  if type(held) == 'string' then
    local ok, info = pcall(cjson.decode, held)
    owner = ok and type(info) == 'table' and info.token or '?'
  elseif held then
    held, owner = '(not a string: edited by hand)', '?'
  end
  if (owner or '') ~= token then
    return redis.error_reply('MOVE_LOCKED holder=' .. string.sub(held or '', 1, 300))
  end
  return nil
end
