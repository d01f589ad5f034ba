-- The result wake-up: Queue.result() blocks on a per-job list `result:<id>` (BLMOVE onto itself,
-- so every waiter sees the element and it stays for the next). One element at most, expiring
-- with the outcome record; the outcome word ('done' | 'dead' | 'cancelled') is advisory: the
-- waiter re-reads the job hash, which is the truth.

-- A parked job's record does not expire (dead-letter retention trims it): its wake-up lives this
-- long, past any reasonable result() wait; a waiter that comes later reads the state first.
local RESULT_WAKE_DEAD_TTL_MS = 3600000

-- Only for a job someone waits on: Queue.result() sets `result_wait:<id>` before its last state
-- check, so a job nobody waits for costs one EXISTS here and leaves no key behind (a finished
-- job's wake-up list would otherwise live as long as its record).
local function result_wake(prefix, id, outcome, ttl_ms)
  if redis.call('EXISTS', prefix .. 'result_wait:' .. id) == 0 then return end
  local k = prefix .. 'result:' .. id
  -- Ours alone, and only a wake-up: one edited into another type (by hand) is replaced, since
  -- the callers (complete, fail's park, cancel) have written already and may not raise.
  if type(redis.pcall('LPUSH', k, outcome)) ~= 'number' then
    redis.call('DEL', k)
    redis.call('LPUSH', k, outcome)
  end
  redis.call('LTRIM', k, 0, 0)
  redis.call('PEXPIRE', k, ttl_ms)
end

-- The finished index `finished` (ZSET id -> the ms its outcome record expires), for listings of
-- done and cancelled jobs (list_jobs('finished'), latest to expire first: the order they
-- finished in, among jobs kept equally long). Each id leaves it when its record expires, so a
-- listing reads no expired id, and the soonest to expire leave first beyond FINISHED_MAX; the
-- key expires with the last of them.
-- Only an index: one edited into another type (by hand) is left as it is (doctor reports it),
-- as the callers have written the outcome and may not raise.
local FINISHED_MAX = 10000
-- `entries`: expires_ms, id, expires_ms, id, ... (ZADD's own argument order).
local function finished_add(prefix, now, entries)
  local k = prefix .. 'finished'
  for i = 1, #entries, UNPACK_STEP do
    local n = redis.pcall('ZADD', k, unpack(entries, i, math.min(i + UNPACK_STEP - 1, #entries)))
    if type(n) ~= 'number' then return end
  end
  redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
  local excess = redis.call('ZCARD', k) - FINISHED_MAX
  if excess > 0 then redis.call('ZREMRANGEBYRANK', k, 0, excess - 1) end
  -- The index itself expires with the last record it lists: an idle queue keeps no key of it.
  -- Clamped: a score written by hand (inf, 1e20) must not fail the call after its writes.
  local last = tonumber(redis.call('ZRANGE', k, -1, -1, 'WITHSCORES')[2])
  if last then
    redis.call('PEXPIRE', k, fmt(math.min(math.max(last - now, 1), LIM.ttl_ms)))
  end
end
