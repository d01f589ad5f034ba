--[[ dead_retention: set or clear the queue's opt-in dead-letter retention (`config` hash).
  Applied by lib/job.lua dead_letter on each later park and by each claim, at most 100 of the
  oldest per call.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): config, partitions
  ARGV[1] max_age_ms  ('' = no age limit; 'keep' = as stored; else 1 .. LIM.time_ms)
  ARGV[2] max_count   ('' = no count limit; 'keep' = as stored; else 0 .. 2^53 - 1)
  ('keep': the CLI sets one limit and keeps the other as stored when it writes, not as it read
  it before, so another operator's change of that one meanwhile is not undone)
  Returns: 1.
  Errors:  BAD_ARGUMENT <field>=<value>; BAD_ARGUMENT queue=<name> is partitioned (its own
    name: nothing written) ]]
-- @include "lib/util.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end
-- A partitioned queue's own name: its partitions hold its jobs (scheduler.open_queue acts on them).
local parted = partitioned_err(KEYS[1]); if parted then return parted end

local cfg = KEYS[1] .. 'config'
local fields = { { 'dead_max_age_ms', ARGV[1], 1, LIM.time_ms },
  { 'dead_max_count', ARGV[2], 0, LIM.fence } }
-- Check both before writing either: bad input changes nothing.
for _, f in ipairs(fields) do
  if f[2] ~= '' and f[2] ~= 'keep' then
    local _, err = int_arg(f[2], f[1], f[3], f[4])
    if err then return err end
  end
end
for _, f in ipairs(fields) do
  if f[2] == '' then
    redis.call('HDEL', cfg, f[1])
  elseif f[2] ~= 'keep' then
    redis.call('HSET', cfg, f[1], f[2])
  end
end
return 1
