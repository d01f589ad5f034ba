--[[ heartbeat: extend the leases the caller still holds, many in one call.
  KEYS[1] prefix  KEYS[2] due  KEYS[3] leased  KEYS[4] dead  KEYS[5] wake   (lua/README.md)
  Keys from the prefix (lua/README.md): job:<id>, spec:<id>, config, flow:ck:<key>
  ARGV[1] lease_ms, then pairs: id, token
  Returns: {lease_until_ms, status per pair}; status is
    'held'       extended to lease_until_ms
    'expired'    the lease had lapsed (not yet reaped): refused, the caller must stop
    'stale'      another claim holds the job, or the lapsed lease was reaped
    'cancelled'  the job was cancelled
    'missing'    no such job (or it already finished, or this token already settled it)
  A re-sent call only extends the same leases again. A job of a concurrency key (hash field
    ckey) whose lease a call shortens has its slot's end in flow:ck:<key> lowered with it
    (lib/flow.lua flow_beat).
  Errors:  BAD_ARGUMENT <field>=<value>; CORRUPT leased is not a zset (edited by hand into
    another type: nothing written) ]]
-- @include "lib/clock.lua"
-- @include "lib/util.lua"
-- @include "lib/lease.lua"
-- @include "lib/flow.lua"

local newer = newer_storage_err(KEYS[1]); if newer then return newer end

local prefix, leased = KEYS[1], KEYS[3]
-- lease_check's fields and the job's concurrency key, in the one HMGET it makes per job (a
-- plain job has none: no more commands than before).
local READ = { 'token', 'state', 'settled_token', 'settled', 'settled_log', 'ckey' }
local lease_ms, err = int_arg(ARGV[1], 'lease_ms', 1, LIM.lease_ms)
if err then return err end
if #ARGV % 2 ~= 1 then return redis.error_reply('BAD_ARGUMENT argc=' .. #ARGV) end
local now = now_ms()
local lease_until = now + lease_ms
local out = { fmt(lease_until) }
-- The first extension is ZREM then ZADD, not ZADD XX: at maxmemory (noeviction) Redis refuses a
-- script's first deny-oom command (ZADD) but not ZREM, and lets a script that has written go on.
-- Running jobs keep their leases through a full server, as complete and fail settle them.
local wrote = false
for i = 2, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local status, _, f = lease_check(prefix, id, token, READ)
  if status == 'settled' then
    status = 'missing'
  elseif status == 'held' then
    -- leased edited by hand into another type: met at the first held job, before any write.
    local until_ms = redis.pcall('ZSCORE', leased, id)
    if type(until_ms) == 'table' then
      return corrupt_err('leased', 'zset')
    end
    if not until_ms or tonumber(until_ms) <= now then
      status = 'expired'
    else
      if wrote then
        redis.call('ZADD', leased, 'XX', lease_until, id)
      else
        redis.call('ZREM', leased, id)
        redis.call('ZADD', leased, lease_until, id)
        wrote = true
      end
      -- A shorter lease than before: its key's slot ends no later (lib/flow.lua).
      if f[6] and lease_until < tonumber(until_ms) then flow_beat(prefix, id, f[6], lease_until) end
    end
  end
  out[#out + 1] = status
end
return out
