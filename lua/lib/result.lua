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
