--[[ progress: record how far runs the caller still holds have got, many in one call.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, config
  ARGV triples: id, token, progress (JSON text from the handler's ctx.set_progress, at most
    MAX_PROGRESS_BYTES bytes)
  Writes: job:<id> fields progress and progress_ms (server now), only while the token holds an
    unexpired lease: a stale run (its lease lapsed, another claim holds the job) writes nothing.
  Returns: a status per triple: 'held' (written), else 'expired' | 'stale' | 'cancelled' |
    'missing' as heartbeat answers them (the heartbeat sent in the same round trip acts on them).
  Errors:  BAD_ARGUMENT <field>=<value> (checked for every triple before the first write);
    CORRUPT leased is not a zset (nothing written) ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/lease.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, leased = KEYS[1], KEYS[3]
local MAX_PROGRESS_BYTES = 4096  -- scheduler/core/limits.py MAX_PROGRESS_BYTES
if #ARGV == 0 or #ARGV % 3 ~= 0 then return redis.error_reply('BAD_ARGUMENT argc=' .. #ARGV) end
for i = 1, #ARGV, 3 do
  if #ARGV[i + 2] > MAX_PROGRESS_BYTES then
    return redis.error_reply('BAD_ARGUMENT progress=' .. #ARGV[i + 2] .. ' bytes')
  end
end
local now = now_ms()
local out = {}
for i = 1, #ARGV, 3 do
  local id, token = ARGV[i], ARGV[i + 1]
  local status = lease_check(prefix, id, token)
  if status == 'settled' then
    status = 'missing'
  elseif status == 'held' then
    local until_ms = redis.pcall('ZSCORE', leased, id)
    if type(until_ms) == 'table' then
      -- Only before the first write: a later one would leave earlier progress written.
      if i == 1 then return corrupt_err('leased', 'zset') end
      until_ms = nil
    end
    if not until_ms or tonumber(until_ms) <= now then
      status = 'expired'
    else
      redis.call('HSET', job_key(prefix, id), 'progress', ARGV[i + 2], 'progress_ms', fmt(now))
    end
  end
  out[#out + 1] = status
end
return out
